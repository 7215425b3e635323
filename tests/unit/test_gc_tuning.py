"""gateway/ops/gc_tuning.py: what a serving process sets, undone after the test (the test
process keeps CPython's defaults)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.ops import gc_tuning


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored")
def test_the_threshold_is_raised_and_the_start_up_heap_frozen() -> None:
    _, gen1, gen2 = gc.get_threshold()
    gc_tuning.tune_for_serving()
    assert gc.get_threshold() == (gc_tuning.GEN0_THRESHOLD, gen1, gen2)
    assert gc.get_freeze_count() > 1000  # the modules, classes and functions loaded so far
    assert gc.isenabled()  # cycles are still collected
