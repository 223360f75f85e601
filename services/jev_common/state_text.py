"""The one rendering of a System One state (or any user-supplied value) as text.

Text is sent as is; objects and arrays become compact-spaced JSON text with non-ASCII kept as is
(`json.dumps(value, ensure_ascii=False)`). The worker's prompts, the route key a frontend computes
(route_key.py) and the families that read the state this way (Laya, Cua-S1) all use this function, so
they cannot drift apart. Families whose upstream renders differently (Clef, JEMM, Vela) keep their own.
"""
from __future__ import annotations

import json


def render_state(value: object) -> str:
    """Text as sent; objects and arrays as JSON text (non-ASCII kept as is)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
