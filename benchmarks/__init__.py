"""Benchmarks: a bounded loopback load generator and the comparisons of docs/benchmarks.md."""

import os
import sys

# `python -m tools.X` / `python -m benchmarks.X` from the checkout, as the docs write them: the services
# (jev_common, jev_worker, ...) import without PYTHONPATH=services.
_SERVICES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "services")
if _SERVICES not in sys.path:
    sys.path.insert(0, _SERVICES)

# Libraries' progress bars (transformers' "Loading weights", "Writing model shards") are not what a benchmark
# reports, and a user acts on none of them: off here and in the services it starts (set before tqdm is imported).
from jev_common.logs import no_progress_bars  # noqa: E402

no_progress_bars()
