"""Every failure the factory reports: a class, an exit code, and what to do next."""

from __future__ import annotations

from pathlib import Path


class FatalError(Exception):
    """A failure that ends the command. ``hint`` says what to try next; ``log`` where to look."""

    return_code = 1

    def __init__(self, message: str, *, hint: str | None = None, log: Path | None = None) -> None:
        super().__init__(message)
        self.hint = hint
        self.log = log

    def render(self) -> str:
        lines = [f"error: {self}"]
        if self.log:
            lines.append(f"  log: {self.log}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


class ConfigError(FatalError):
    """targets.toml or a command-line option is wrong."""

    return_code = 2


class EngineError(FatalError):
    """No usable Docker engine (missing, not running, too old)."""

    return_code = 3


class ImageError(FatalError):
    """An image could not be built or is missing."""

    return_code = 4


class BuildError(FatalError):
    """The wheel build failed."""

    return_code = 5


class CheckError(FatalError):
    """A built wheel failed a check (coverage, size, symbols, manifest)."""

    return_code = 6


class GateError(FatalError):
    """The suites failed, or a report does not belong to the wheel."""

    return_code = 7


class PublishError(FatalError):
    """Publishing was refused (no passing report, different bytes, interrupted)."""

    return_code = 8


class ToolError(FatalError):
    """A command the factory runs failed; carries argv and exit code."""

    return_code = 9

    def __init__(self, argv: list[str], code: int, output: str, *, log: Path | None = None,
                 hint: str | None = None) -> None:
        tail = "\n".join(output.strip().splitlines()[-15:])
        super().__init__(f"`{' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''}` exited {code}\n{tail}",
                         log=log, hint=hint)
        self.argv = argv
        self.code = code
