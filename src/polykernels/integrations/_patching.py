"""A reversible set of attribute swaps: what each integration returns to its caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

_MISSING = object()


@dataclass
class Patch:
    """Swapped attributes, restorable in reverse order; also a context manager."""

    description: str
    _undo: list[tuple[Any, str, Any]] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)

    def set(self, owner: Any, name: str, value: Any, label: str) -> None:
        # Instance-level values (a module global, an nn.Module child) are put back; a class-level
        # one (a method) is shadowed, and un-shadowed on restore.
        instance_level = name in getattr(owner, "__dict__", {}) or name in getattr(owner, "_modules", {})
        previous = getattr(owner, name) if instance_level else _MISSING
        self._undo.append((owner, name, previous))
        setattr(owner, name, value)
        self.targets.append(label)

    def restore(self) -> None:
        while self._undo:
            owner, name, previous = self._undo.pop()
            if previous is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)
        self.targets.clear()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.restore()
