"""The one rendering of a System One state (or any user-supplied value) as text.

Text is sent as is; objects and arrays become compact-spaced JSON text with non-ASCII kept as is
(`json.dumps(value, ensure_ascii=False)`). The worker's prompts, the route key a frontend computes
(route_key.py) and the families that read the state this way all use this function, so
they cannot drift apart. Families whose upstream renders differently keep their own (in jev_worker/families/).

`indexed_json` is the variant of upstreams that number the items of long arrays (two
families' upstreams, both as `annotate_indices`): every array of `INDEX_MIN` or more items, at any depth, has
each item `i` written as `{"_index": i, **item}` (an object) or `{"_index": i, "value": item}`.
"""

from __future__ import annotations

import json

INDEX_MIN = 8  # arrays this long get `_index` on every item (upstream's ANNOTATE_MIN)


def render_state(value: object) -> str:
    """Text as sent; objects and arrays as JSON text (non-ASCII kept as is)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def annotate_indices(value: object, min_len: int = INDEX_MIN) -> object:
    """`value` with every array of `min_len` or more items numbered (`_index`), recursively."""
    if isinstance(value, list):
        if len(value) >= min_len:
            return [
                {"_index": i, **_annotated_dict(item, min_len)}
                if isinstance(item, dict)
                else {"_index": i, "value": annotate_indices(item, min_len)}
                for i, item in enumerate(value)
            ]
        return [annotate_indices(item, min_len) for item in value]
    if isinstance(value, dict):
        return _annotated_dict(value, min_len)
    return value


def _annotated_dict(value: dict[str, object], min_len: int) -> dict[str, object]:
    return {key: annotate_indices(item, min_len) for key, item in value.items()}


def indexed_json(value: object) -> str:
    """Python's `json.dumps(annotate_indices(value), ensure_ascii=False)`: separators ", " and ": ", keys in
    request order, floats as Python writes them."""
    return json.dumps(annotate_indices(value), ensure_ascii=False)
