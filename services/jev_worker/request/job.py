"""A request as the pipeline answers it, whatever its form (envelope.py, legacy.py, a family's own form)."""

from __future__ import annotations

from ..values.datatypes import (
    ImageSlot as ImageSlot,  # declared below the protocols
    Job as Job,
)
