"""Tools run as `python -m tools.NAME` from the checkout."""

import os
import sys

# `python -m tools.X` / `python -m benchmarks.X` from the checkout, as the docs write them: the services
# (jev_common, jev_worker, ...) import without PYTHONPATH=services.
_SERVICES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "services")
if _SERVICES not in sys.path:
    sys.path.insert(0, _SERVICES)
