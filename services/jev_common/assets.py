"""Image assets: precomputed vision-tower embeddings, one folder per exact data URI.

Layout (docs/images.md): `<asset_dir>/<key>/emb.safetensors` (tensor "embeds" [n_tokens, hidden],
exactly what the language model consumes at the image-pad positions) and `<asset_dir>/<key>/grid.json`
(patch grid [t, h, w], dtype, shape, checkpoint + processor identity, created). `key` is
sha256(the image file's bytes).hexdigest(), whether they arrive as a data URI (base64-decoded, never
pixel-decoded), inline base64 or a multipart part: the worker hashes what it is sent and never
decodes an image.

Writes are atomic: everything goes into `<asset_dir>/.tmp-<key>-<random>` and is renamed into place,
under a per-key lock file (`<asset_dir>/.locks/<key>.lock`, flock) so a concurrent writer's temp dir
is never mistaken for an interrupted one. Complete = the folder with both files and a parseable
grid.json; anything else (a temp dir left by a killed writer, a folder missing a file) is incomplete
and is removed and redone by the next writer.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import BodyTooLarge, ImageInvalid, ImageNotPrepared, InvalidRequest, validation_error

ASSET_FORMAT = 1
EMB_FILE = "emb.safetensors"
GRID_FILE = "grid.json"
TENSOR_NAME = "embeds"
TMP_PREFIX = ".tmp-"
LOCK_DIR = ".locks"

DEFAULT_MAX_IMAGE_BYTES = 10 << 20  # decoded bytes of one image
DEFAULT_MAX_IMAGE_PIXELS = 25_000_000  # width * height, checked before the pixels are decoded
MIME_TYPES = ("png", "jpeg", "jpg", "webp", "gif")

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HEADER_RE = re.compile(r"^data:(?P<mime>[^;,]*)(?P<params>(;[^;,]*)*),", re.DOTALL)
_WS_RE = re.compile(r"\s+")


# --- keys and data URIs -------------------------------------------------------------------------


def bytes_key(data: bytes) -> str:
    """sha256 of the image file's bytes, hex: the asset's name everywhere. The same bytes give the same
    key whether they came as a data URI, inline base64 or a multipart part."""
    return hashlib.sha256(data).hexdigest()


def decode_base64(text: str) -> bytes:
    """Standard base64 with whitespace ignored (how every service reads an inline image); ValueError when it
    is not valid base64."""
    try:
        return base64.b64decode(_WS_RE.sub("", text or ""), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None


def asset_bytes(
    reference: str, asset: Any, parts: dict[str, bytes], *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
) -> bytes:
    """The image bytes of one System One asset (`assets[reference]`: a multipart part, or inline base64)."""
    if asset.part is not None:
        if asset.part not in parts:
            raise validation_error(
                f"asset {reference!r} names multipart part {asset.part!r}, which is not in the request",
                ("assets", reference, "part"),
                "missing",
            )
        data = parts[asset.part]
    else:
        try:
            data = decode_base64(asset.data_base64 or "")
        except ValueError:
            raise validation_error(
                f"asset {reference!r}: data_base64 is not valid base64", ("assets", reference, "data_base64")
            ) from None
    if not data:
        raise validation_error(f"asset {reference!r} is empty", ("assets", reference))
    if len(data) > max_bytes:
        raise BodyTooLarge(f"asset {reference!r} is {len(data)} bytes; the limit is {max_bytes}")
    return data


def asset_key(data_uri: str) -> str:
    """The key of a data URI's image: sha256 of its base64-decoded bytes (the pixels are never decoded)."""
    return bytes_key(split_data_uri(data_uri)[1])


def short_key(key: str) -> str:
    return f"sha256:{key}"


class ImageRejected(InvalidRequest):
    """A state.image that is not a usable base64 image data URI. `reason` is a stable code:
    not_a_string, url, not_data_uri, not_image_type, not_base64, malformed_base64, too_large,
    too_many_pixels, not_image."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class DecodedImage:
    mime: str
    data: bytes
    image: object  # PIL.Image.Image, RGB, pixels loaded
    width: int
    height: int
    format: str
    frames: int = 1  # frames in the file (an animated PNG or GIF has several; the first is decoded)


def split_data_uri(data_uri: object, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> tuple[str, bytes]:
    """Validate the URI form and decode the base64 payload -> (mime subtype, bytes). No PIL."""
    if not isinstance(data_uri, str):
        raise ImageRejected("not_a_string", f"state.image must be a string data URI, got {type(data_uri).__name__}")
    head = data_uri[:64]
    if data_uri.startswith(("http://", "https://", "ftp://", "file:", "s3://", "gs://")) or (
        "://" in head and _SCHEME_RE.match(head) and not data_uri.startswith("data:")
    ):
        raise ImageRejected(
            "url",
            f"state.image is a URL ({head[:40]!r}...); images are not fetched: send a "
            "base64 data URI (data:image/png;base64,...)",
        )
    if not data_uri.startswith("data:"):
        raise ImageRejected(
            "not_data_uri", f"state.image must be a base64 data URI (data:image/png;base64,...), got {head[:24]!r}..."
        )
    match = _HEADER_RE.match(data_uri[:512])
    if not match:
        raise ImageRejected("not_data_uri", "state.image data URI has no ',' after its media type")
    mime = match.group("mime").strip().lower()
    params = [p.strip().lower() for p in match.group("params").split(";") if p.strip()]
    if not mime.startswith("image/") or mime.removeprefix("image/") not in MIME_TYPES:
        raise ImageRejected(
            "not_image_type",
            f"state.image media type {mime or '(none)'!r} is not one of {', '.join('image/' + m for m in MIME_TYPES)}",
        )
    if "base64" not in params:
        raise ImageRejected("not_base64", "state.image data URI must be base64-encoded (;base64,)")
    payload = data_uri[match.end() :]
    if (len(payload) * 3) // 4 > max_bytes + 3:
        raise ImageRejected(
            "too_large", f"image is about {(len(payload) * 3) // 4} bytes decoded; the limit is {max_bytes}"
        )
    compact = _WS_RE.sub("", payload)
    if not compact:
        raise ImageRejected("malformed_base64", "state.image data URI has an empty payload")
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageRejected("malformed_base64", f"state.image payload is not valid base64: {exc}") from None
    if len(data) > max_bytes:
        raise ImageRejected("too_large", f"image is {len(data)} bytes decoded; the limit is {max_bytes}")
    return mime.removeprefix("image/"), data


def decode_data_uri(
    data_uri: object, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> DecodedImage:
    """Parse, bound and decode a base64 image data URI into an RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    mime, data = split_data_uri(data_uri, max_bytes=max_bytes)
    try:
        with warnings_as_errors():
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise ImageRejected(
                    "too_many_pixels", f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}"
                )
            image.load()
            fmt = image.format or mime.upper()
            frames = int(getattr(image, "n_frames", 1))
            image = image.convert("RGB")  # type: ignore[assignment]  # an Image, read as such below
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageRejected("too_many_pixels", f"image exceeds the pixel limit of {max_pixels}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise ImageRejected(
            "not_image", f"state.image data is not a decodable image ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None
    if width < 1 or height < 1:
        raise ImageRejected("not_image", "image has no pixels")
    return DecodedImage(mime=mime, data=data, image=image, width=width, height=height, format=fmt, frames=frames)


@contextlib.contextmanager
def warnings_as_errors() -> Iterator[None]:
    import warnings

    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        yield


# --- assets on disk -----------------------------------------------------------------------------


@dataclass
class ImageAsset:
    key: str
    embeds: Any  # torch.Tensor [n_tokens, hidden]
    grid_thw: tuple[int, int, int]
    meta: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0

    @property
    def n_tokens(self) -> int:
        return int(self.embeds.shape[0])


def check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"asset key must be 64 lowercase hex characters, got {key!r}")
    return key


def asset_path(asset_dir: str | os.PathLike[str], key: str) -> Path:
    return Path(asset_dir) / check_key(key)


AssetState = Literal["complete", "incomplete", "absent"]


def asset_state(asset_dir: str | os.PathLike[str], key: str) -> AssetState:
    """complete: folder with both files and a parseable grid.json; incomplete: a folder missing
    either, or an unparseable grid.json, or a leftover temp dir for this key; absent: nothing."""
    final = asset_path(asset_dir, key)
    if final.is_dir():
        return "complete" if _read_grid(final) is not None and (final / EMB_FILE).is_file() else "incomplete"
    if final.exists():
        return "incomplete"
    return "incomplete" if _leftover_tmp_dirs(Path(asset_dir), key) else "absent"


def _read_grid(folder: Path) -> dict[str, Any] | None:
    try:
        grid = json.loads((folder / GRID_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return grid if isinstance(grid, dict) and "grid" in grid else None


def read_grid(asset_dir: str | os.PathLike[str], key: str) -> dict[str, Any] | None:
    return _read_grid(asset_path(asset_dir, key))


def _leftover_tmp_dirs(asset_dir: Path, key: str) -> list[Path]:
    try:
        return [p for p in asset_dir.iterdir() if p.name.startswith(f"{TMP_PREFIX}{key}-")]
    except OSError:
        return []


@contextlib.contextmanager
def key_lock(asset_dir: str | os.PathLike[str], key: str) -> Iterator[None]:
    """Exclusive per-key lock (flock; released by the kernel if the holder dies)."""
    lock_dir = Path(asset_dir) / LOCK_DIR
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{check_key(key)}.lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_incomplete(asset_dir: str | os.PathLike[str], key: str) -> list[str]:
    """Remove leftover temp dirs and an incomplete final folder for `key`. Call under key_lock.
    Returns what was removed."""
    root = Path(asset_dir)
    removed = []
    for tmp in _leftover_tmp_dirs(root, key):
        _remove(tmp)
        removed.append(tmp.name)
    final = asset_path(root, key)
    if final.exists() and asset_state(root, key) != "complete":
        _remove(final)
        removed.append(final.name)
    return removed


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def write_asset(out_dir: str | os.PathLike[str], key: str, embeds: Any, grid_thw: Any, meta: dict[str, Any]) -> Path:
    """Write `<out>/<key>/` atomically and return it. `meta` must carry `identity` (checkpoint) and
    `processor_identity`; it may add image facts (width, height, mime). An existing folder for the key
    (incomplete, or made for another identity) is replaced; a complete one is replaced too, so call
    `asset_state` first to skip work."""
    from safetensors.torch import save_file

    check_key(key)
    for needed in ("identity", "processor_identity"):
        if not meta.get(needed):
            raise ValueError(f"write_asset needs meta[{needed!r}]")
    grid = [int(x) for x in (grid_thw.tolist() if hasattr(grid_thw, "tolist") else grid_thw)]
    if len(grid) != 3:
        raise ValueError(f"grid_thw must be [t, h, w], got {grid}")
    if embeds.ndim != 2:
        raise ValueError(f"embeds must be [n_tokens, hidden], got shape {tuple(embeds.shape)}")
    merge = int(meta.get("merge_size", 2))
    n_tokens = grid[0] * grid[1] * grid[2] // (merge * merge)
    if n_tokens != embeds.shape[0]:
        raise ValueError(f"grid {grid} with merge {merge} means {n_tokens} tokens, embeds have {embeds.shape[0]}")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    tensor = embeds.detach().to("cpu").contiguous()
    record = {
        "format": ASSET_FORMAT,
        "key": key,
        "grid": grid,
        "merge_size": merge,
        "n_tokens": n_tokens,
        "dtype": _dtype_name(tensor),
        "shape": list(tensor.shape),
        "nbytes": tensor.numel() * tensor.element_size(),
        **{k: v for k, v in meta.items() if k not in ("grid", "key", "format", "shape", "dtype", "n_tokens")},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with key_lock(root, key):
        remove_incomplete(root, key)
        tmp = root / f"{TMP_PREFIX}{key}-{secrets.token_hex(6)}"
        tmp.mkdir()
        try:
            save_file(
                {TENSOR_NAME: tensor},
                str(tmp / EMB_FILE),
                metadata={"key": key, "identity": str(meta["identity"]), "format": str(ASSET_FORMAT)},
            )
            with open(tmp / GRID_FILE, "w", encoding="utf-8") as handle:
                json.dump(record, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            with open(tmp / EMB_FILE, "rb") as handle:
                os.fsync(handle.fileno())
            _fsync_dir(tmp)
            final = root / key
            if final.exists():  # complete but replaced (e.g. made for another checkpoint)
                trash = root / f"{TMP_PREFIX}{key}-old-{secrets.token_hex(6)}"
                os.rename(final, trash)
                os.rename(tmp, final)
                _remove(trash)
            else:
                os.rename(tmp, final)
            _fsync_dir(root)
        except BaseException:
            _remove(tmp)
            raise
    return root / key


def not_prepared(key: str, detail: str = "") -> ImageNotPrepared:
    extra = f" ({detail})" if detail else ""
    return ImageNotPrepared(
        f"image {short_key(key)} is not prepared{extra}; run the preencoder on it first: POST "
        '[{"image": "data:image/png;base64,..."}] to /v1/preencode (the frontend passes it to the preencoder), '
        "or put that line in a manifest for python -m jev_preencoder encode --manifest FILE.jsonl --out "
        "$JEV_ASSET_DIR (the asset is named sha256 of the image bytes)"
    )


def invalid(key: str, detail: str) -> ImageInvalid:
    return ImageInvalid(f"image asset {short_key(key)} is unusable: {detail}; re-run the preencoder on it")


def read_asset(
    asset_dir: str | os.PathLike[str],
    key: str,
    *,
    identity: str | None = None,
    processor_identity: str | None = None,
    folder: str | os.PathLike[str] | None = None,
) -> ImageAsset:
    """Load and check one asset. `identity` / `processor_identity`, when given, must match what the
    asset was made with (ImageInvalid, 422 asset_invalid, otherwise: never silently used). `folder` overrides
    `<asset_dir>/<key>` (a path from the cache index)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    check_key(key)
    path = Path(folder) if folder is not None else asset_path(asset_dir, key)
    if not path.is_dir():
        raise not_prepared(key)
    grid_file, emb_file = path / GRID_FILE, path / EMB_FILE
    if not grid_file.is_file() or not emb_file.is_file():
        missing = [f.name for f in (emb_file, grid_file) if not f.is_file()]
        raise not_prepared(key, f"incomplete: {', '.join(missing)} missing")
    try:
        record = json.loads(grid_file.read_text(encoding="utf-8"))
        grid = tuple(int(x) for x in record["grid"])
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"bad grid {record['grid']!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise invalid(key, f"{GRID_FILE} is corrupt ({type(exc).__name__}: {str(exc)[:100]})") from None
    if record.get("format") != ASSET_FORMAT:
        raise invalid(key, f"format {record.get('format')!r}, this build reads format {ASSET_FORMAT}")
    if record.get("key") not in (None, key):
        raise invalid(key, f"{GRID_FILE} names another key {record.get('key')!r}")
    if identity is not None and record.get("identity") != identity:
        raise invalid(key, f"made for checkpoint {record.get('identity')!r}, this service runs {identity!r}")
    if processor_identity is not None and record.get("processor_identity") != processor_identity:
        raise invalid(
            key,
            f"made with image processor {record.get('processor_identity')!r}, this service uses {processor_identity!r}",
        )
    try:
        tensors = load_file(str(emb_file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise invalid(key, f"{EMB_FILE} is corrupt ({type(exc).__name__}: {str(exc)[:100]})") from None
    embeds = tensors.get(TENSOR_NAME)
    if embeds is None or embeds.ndim != 2:
        raise invalid(key, f"{EMB_FILE} has no 2-D tensor {TENSOR_NAME!r}")
    merge = int(record.get("merge_size", 2))
    expected = grid[0] * grid[1] * grid[2] // (merge * merge)
    if embeds.shape[0] != expected or list(embeds.shape) != list(record.get("shape", embeds.shape)):
        raise invalid(key, f"embeddings are {tuple(embeds.shape)}, grid {list(grid)} needs {expected} rows")
    return ImageAsset(key=key, embeds=embeds, grid_thw=grid, meta=record, nbytes=embeds.numel() * embeds.element_size())
