"""benchmarks.coherence's token split: the row tokens the worker's packed forwards run (the whole run path is
tests/benchmarks/test_run_paths.py::test_coherence_tiny)."""

from __future__ import annotations

from benchmarks.coherence import computed_row_tokens


def test_rows_sharing_a_stem_run_it_once_and_other_rows_run_whole():
    shifts = [tuple(range(20)) + (100 + i,) * 5 for i in range(3)]  # a question line, then three listings
    assert computed_row_tokens(shifts) == 20 + 3 * 5
    assert computed_row_tokens([(1, 2, 3), (4, 5, 6)]) == 6  # nothing shared
    assert computed_row_tokens(shifts, pack_tokens=30) == 2 * 20 + 3 * 5  # split over two packs: the stem twice
