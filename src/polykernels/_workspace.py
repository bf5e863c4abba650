"""Scratch memory of a multi-kernel op as one allocation, its parts passed to kernels as addresses.

An op whose kernels hand each other intermediates (the gated delta rule's prepare pass writes w, u
and the scores for its sequential pass) allocated each one per call: about 2-3 us of host time per
``torch.empty`` on a GPU host, for tensors nobody outside the op sees. A ``Layout`` is worked out
once per class of call; each call then allocates one buffer and passes ``base + offset`` for each
part (``_launch.Launcher`` takes addresses), and views only when Triton's own launch needs tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Each part starts on a 256-byte boundary: 16-byte aligned as Triton's launcher assumes of fresh
# tensors, and as wide as the caching allocator's own alignment of a block's start (512) allows.
ALIGNMENT = 256


@dataclass(frozen=True)
class Part:
    offset: int  # bytes from the buffer's start
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Layout:
    parts: tuple[Part, ...]
    nbytes: int

    @staticmethod
    def of(parts: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> Layout:
        """Parts in order, each at the next aligned offset (an empty part takes no room)."""
        placed, offset = [], 0
        for shape, dtype in parts:
            placed.append(Part(offset, tuple(shape), dtype))
            offset += -(-math.prod(shape) * dtype.itemsize // ALIGNMENT) * ALIGNMENT
        return Layout(tuple(placed), max(offset, ALIGNMENT))

    def allocate(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def addresses(self, buffer: torch.Tensor) -> tuple[int, ...]:
        base = buffer.data_ptr()
        return tuple(base + part.offset for part in self.parts)

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each part as a tensor viewing the buffer (for Triton's own launch and the interpreter)."""
        return tuple(buffer[part.offset:part.offset + math.prod(part.shape) * part.dtype.itemsize]
                     .view(part.dtype).view(part.shape) for part in self.parts)
