"""The worker's image path: stored embeddings in, never pixels.

- `image_placeholder`: the prompt text standing for one image (vision start, one image-pad token per
  merged patch, vision end), tokenised like any other prompt text.
- `splice_image_embeds`: token embeddings from the model's own input embedding layer with the
  asset embeddings written at the image-pad positions (what Qwen2-VL's forward does with the output
  of its vision tower), and M-RoPE positions from the model's own `get_rope_index`.
- `text_positions`: positions for text rows that follow a (cached) prefix: index + rope_delta on all
  three M-RoPE axes, as the model itself does for tokens after the prompt.
- `AssetStore`: image bytes (or a data URI) -> ImageAsset via sha256(bytes), an L2 LRU of parsed assets by bytes, the
  Redis index (when reachable) and the asset folder (always the fallback).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re

import torch

from jev_common.assets import ImageAsset, asset_key, asset_state, invalid, not_prepared, read_asset
from jev_common.errors import validation_error
from jev_common.index import IndexUnavailable
from jev_common.index.assets import AssetIndex
from jev_common.schema import CacheLevelStats

from ..scheduling.caches import BudgetLRU

log = logging.getLogger("jev.worker.vision")

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
IMAGE_ITEM = VISION_START + IMAGE_PAD + VISION_END  # how a Qwen chat template renders one image item
PLACED_IMAGE = re.compile(re.escape(VISION_START) + f"(?:{re.escape(IMAGE_PAD)})+" + re.escape(VISION_END))
_URI_HEAD_RE = re.compile(r"^data:image/[A-Za-z0-9.+-]+(;[^;,]*)*;base64,")


def _tokenizer(processor_or_tokenizer):
    return getattr(processor_or_tokenizer, "tokenizer", processor_or_tokenizer)


def _merge(asset: ImageAsset) -> int:
    return int(asset.meta.get("merge_size", 2))


def image_token_count(asset: ImageAsset) -> int:
    t, h, w = asset.grid_thw
    n = t * h * w // (_merge(asset) ** 2)
    if n != asset.n_tokens:
        raise invalid(asset.key, f"grid {list(asset.grid_thw)} means {n} tokens, the embeddings have {asset.n_tokens}")
    return n


def image_placeholder(processor_or_tokenizer, asset: ImageAsset) -> str:
    """`<|vision_start|>` + `<|image_pad|>` * n_tokens + `<|vision_end|>` (n = t*h*w // merge**2)."""
    source = processor_or_tokenizer
    image_token = getattr(source, "image_token", None) or IMAGE_PAD
    start = getattr(source, "vision_start_token", None) or VISION_START
    end = getattr(source, "vision_end_token", None) or VISION_END
    tokenizer = _tokenizer(source)
    if hasattr(tokenizer, "convert_tokens_to_ids"):
        unk = getattr(tokenizer, "unk_token_id", None)
        for token in (start, image_token, end):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == unk:
                raise ValueError(f"tokenizer has no {token} token: not a Qwen2-VL style vision-language checkpoint")
    return start + image_token * image_token_count(asset) + end


def placed_images(state_text: str, image_keys) -> list[str]:
    """The expanded placeholders the service put into `state_text`, in order, one per image key."""
    images = PLACED_IMAGE.findall(state_text)
    if len(images) != len(image_keys):
        raise ValueError(f"{len(images)} image placeholders for {len(image_keys)} images")
    return images


def _rope_owner(model):
    for candidate in (getattr(model, "model", None), model):
        if candidate is not None and hasattr(candidate, "get_rope_index"):
            return candidate
    raise TypeError(f"{type(model).__name__} has no get_rope_index: not an M-RoPE vision-language model")


def splice_image_embeds(model, input_ids: torch.Tensor, assets: list[ImageAsset]):
    """-> (inputs_embeds [1, L, H], position_ids [3, 1, L], rope_delta int) for one prompt row."""
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"splice_image_embeds takes one row [1, L], got {tuple(input_ids.shape)}")
    config = model.config
    embed_layer = model.get_input_embeddings()
    inputs_embeds = embed_layer(input_ids)
    image_mask = input_ids == config.image_token_id
    n_pad = int(image_mask.sum())
    expected = sum(image_token_count(a) for a in assets)
    if n_pad != expected:
        raise ValueError(f"prompt has {n_pad} image-pad tokens, the {len(assets)} image(s) need {expected}")
    if not assets:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).view(1, 1, -1).expand(3, 1, -1)
        return inputs_embeds, positions, 0
    hidden = inputs_embeds.shape[-1]
    for asset in assets:
        if asset.embeds.shape[-1] != hidden:
            raise invalid(asset.key, f"embeddings are {asset.embeds.shape[-1]} wide, the model's are {hidden}")
    image_embeds = torch.cat([a.embeds for a in assets], dim=0).to(inputs_embeds.device, inputs_embeds.dtype)
    inputs_embeds = inputs_embeds.masked_scatter(image_mask.unsqueeze(-1).expand_as(inputs_embeds), image_embeds)
    grid = torch.tensor([list(a.grid_thw) for a in assets], dtype=torch.long, device=input_ids.device)
    position_ids, deltas = _rope_owner(model).get_rope_index(
        input_ids,
        mm_token_type_ids=image_mask.to(torch.int),
        image_grid_thw=grid,
    )
    return inputs_embeds, position_ids, int(deltas.reshape(-1)[0])


def text_positions(start: int, length: int, rope_delta, batch: int) -> torch.Tensor:
    """[3, batch, length] positions for text at sequence indices start..start+length-1 after a prefix
    whose M-RoPE delta is `rope_delta` (an int, or one per row as a tensor of `batch` values)."""
    base = torch.arange(start, start + length, dtype=torch.long)
    if isinstance(rope_delta, torch.Tensor) and rope_delta.numel() > 1:
        delta = rope_delta.reshape(-1, 1).to(torch.long).cpu()
        if delta.shape[0] != batch:
            raise ValueError(f"{delta.shape[0]} rope deltas for {batch} rows")
        return (base.view(1, -1) + delta).unsqueeze(0).expand(3, -1, -1)
    return (base + int(rope_delta)).view(1, 1, -1).expand(3, batch, -1)


class AssetStore:
    """data URI -> (ImageAsset, l2_hit). L2 holds parsed assets by byte budget (0 turns it off, so
    every request rereads its asset). Lookup: L2, then the index's path, then `<asset_dir>/<key>`."""

    def __init__(
        self,
        asset_dir: str,
        index: AssetIndex | None,
        identity: str,
        l2: BudgetLRU | int,
        *,
        processor_identity: str | None = None,
    ):
        """`l2`: the worker's L2 (caches.WorkerCaches), or a byte budget for one of its own."""
        self.asset_dir = asset_dir
        self.index = index
        self.identity = identity
        self.processor_identity = processor_identity
        self.l2: BudgetLRU[ImageAsset] = (
            l2 if isinstance(l2, BudgetLRU) else BudgetLRU("l2", l2, size_of=lambda a: a.nbytes)
        )
        self._inflight: dict[str, asyncio.Future] = {}
        self.index_hits = self.index_misses = self.index_unavailable = self.stale_removed = 0
        self.disk_reads = 0

    @staticmethod
    def key_for(data_uri: str) -> str:
        if not isinstance(data_uri, str) or not _URI_HEAD_RE.match(data_uri[:256]):
            raise validation_error("state.image must be a base64 image data URI (data:image/png;base64,...)")
        return asset_key(data_uri)

    async def get(self, data_uri: str) -> tuple[ImageAsset, bool]:
        return await self.get_by_key(self.key_for(data_uri))

    async def get_by_key(self, key: str) -> tuple[ImageAsset, bool]:
        asset = self.l2.get(key)
        if asset is not None:
            return asset, True
        pending = self._inflight.get(key)
        if pending is not None:  # another request is reading the same asset: share its result
            return await asyncio.shield(pending), False
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            asset = await self._load(key)
            future.set_result(asset)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._inflight.pop(key, None)
        self.l2.put(key, asset)
        return asset, False

    async def _indexed_folder(self, key: str) -> str | None:
        """The folder the index names, when the index is reachable and the folder is there."""
        if self.index is None:
            return None
        try:
            entry = await self.index.lookup(key)
        except IndexUnavailable:
            self.index_unavailable += 1
            return None
        if entry is None:
            self.index_misses += 1
            return None
        path = entry.get("path") or ""
        if (
            path
            and asset_state(os.path.dirname(path), os.path.basename(path)) == "complete"
            and os.path.basename(path) == key
        ):
            self.index_hits += 1
            return path
        if asset_state(self.asset_dir, key) != "complete":
            self.stale_removed += 1  # the entry names a file that is gone: drop it, answer "not prepared"
            log.info("cache index entry for %s points at a missing asset %s: removed", key, path)
            try:
                await self.index.remove(key)
            except IndexUnavailable:
                self.index_unavailable += 1
            raise not_prepared(key, "the cache index named a file that no longer exists")
        return None

    async def _load(self, key: str) -> ImageAsset:
        folder = await self._indexed_folder(key)
        self.disk_reads += 1
        asset = await asyncio.to_thread(
            read_asset,
            self.asset_dir,
            key,
            identity=self.identity,
            processor_identity=self.processor_identity,
            folder=folder,
        )
        return asset

    def stats(self) -> CacheLevelStats:
        return self.l2.stats()

    def counters(self) -> dict:
        return {
            **self.l2.stats().model_dump(exclude={"enabled"}),
            "disk_reads": self.disk_reads,
            "index_hits": self.index_hits,
            "index_misses": self.index_misses,
            "index_unavailable": self.index_unavailable,
            "stale_removed": self.stale_removed,
        }

    def reset_counters(self) -> None:
        self.l2.reset_counters()
        self.index_hits = self.index_misses = self.index_unavailable = self.stale_removed = 0
        self.disk_reads = 0

    def clear(self) -> None:
        self.l2.clear()
