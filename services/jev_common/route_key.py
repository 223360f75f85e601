"""The routing key of a request's state: what a frontend (no tokenizer) and a worker both compute.

A worker's L3 key (`prefix_key`, jev_worker.prompt.builder) hashes the checkpoint identity, the image keys and
the prefix *token ids*; a frontend cannot tokenize, so it cannot compute it. Instead both sides hash
what decides the prefix before tokenisation: the state as the worker renders it (text as sent; objects
and arrays as JSON text, jev_common.state_text.render_state) and the sorted keys of its images
(sha256 of the image bytes, jev_common.assets). The worker registers this key next to each prefix it
holds in L3 (jev_common.index.routes), so the frontend finds where a state is warm. Same model,
same route key -> same prefix; the namespace (checkpoint) keeps models apart.
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Iterable
from typing import Any

from .assets import asset_bytes, asset_key, bytes_key
from .errors import DomainError
from .state_text import render_state  # noqa: F401 - the state text as the worker renders it (one function)


def state_route_key(state_text: str, image_keys: Iterable[str] = ()) -> str:
    digest = hashlib.sha256(b"jev-route-v1|")
    digest.update(",".join(sorted(set(image_keys))).encode())
    digest.update(b"|")
    digest.update(state_text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def envelope_image_keys(assets: dict[str, Any] | None, parts: dict[str, bytes]) -> list[str]:
    """Keys of a System One request's assets (validated model's `assets`), as the worker names them.
    Assets that cannot be read are skipped: the worker answers their error itself."""
    keys = []
    for reference, asset in (assets or {}).items():
        try:
            keys.append(bytes_key(asset_bytes(reference, asset, parts)))
        except DomainError:
            continue
    return keys


def legacy_image_keys(image: str | None) -> list[str]:
    """The key of the single-question form's `state.image` data URI (none when absent or unreadable)."""
    if not image:
        return []
    try:
        return [asset_key(image)]
    except (ValueError, binascii.Error):
        return []
