"""polykernels._workspace: one allocation for a multi-kernel op's intermediates."""

from __future__ import annotations

import torch

from polykernels._workspace import ALIGNMENT, Layout


def test_parts_start_aligned_and_an_empty_part_takes_no_room() -> None:
    layout = Layout.of([((3, 5), torch.bfloat16), ((0,), torch.int64), ((7,), torch.float32), ((2, 2), torch.int64)])
    assert [part.offset for part in layout.parts] == [0, ALIGNMENT, ALIGNMENT, 2 * ALIGNMENT]
    assert layout.nbytes == 3 * ALIGNMENT


def test_views_are_the_parts_of_the_buffer_at_their_addresses() -> None:
    layout = Layout.of([((4, 3), torch.float32), ((5,), torch.int64), ((0, 2), torch.float32)])
    buffer = layout.allocate(torch.device("cpu"))
    views = layout.views(buffer)
    # (torch gives an empty view the address 0: no kernel reads an empty part.)
    assert [view.data_ptr() for view in views[:2]] == list(layout.addresses(buffer))[:2]
    assert [(tuple(view.shape), view.dtype) for view in views] == [((4, 3), torch.float32), ((5,), torch.int64),
                                                                  ((0, 2), torch.float32)]
    views[1].copy_(torch.arange(5))
    assert torch.equal(layout.views(buffer)[1], torch.arange(5))  # written through the buffer, not a copy
    # The parts do not overlap: filling one leaves the other as it was.
    views[0].fill_(1.5)
    assert torch.equal(layout.views(buffer)[1], torch.arange(5))


def test_a_layout_of_nothing_still_allocates_a_valid_buffer() -> None:
    layout = Layout.of([((0,), torch.float32)])
    assert layout.nbytes == ALIGNMENT and layout.allocate(torch.device("cpu")).numel() == ALIGNMENT
