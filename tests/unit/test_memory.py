"""labkit.sync.memory: the kernel's resident high-water mark sees a transient allocation that is gone again by
the time the block ends (what a planned figure cannot count), and not one made before the block."""

import pytest
import torch

from labkit.sync.memory import PeakRSS

MB = 1 << 20


def test_a_transient_allocation_is_seen_after_it_is_freed():
    before = torch.ones(64 * MB, dtype=torch.uint8)  # resident before the block: not counted
    with PeakRSS() as m:
        t = torch.ones(96 * MB, dtype=torch.uint8)  # touched, so resident
        del t
    if m.rise is None:
        pytest.skip("this kernel offers no resident high-water-mark reset (/proc/self/clear_refs)")
    assert 0.95 * 96 * MB <= m.rise < 96 * MB + 32 * MB, m.rise  # RSS counts pages, give or take the allocator
    del before


def test_nothing_allocated_is_a_small_rise():
    with PeakRSS() as m:
        pass
    assert m.rise is None or m.rise < 8 * MB
