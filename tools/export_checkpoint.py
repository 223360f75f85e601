"""Export a checkpoint for serving: stream its safetensors shards, merge a LoRA, cut the decision head.

    python -m tools.export_checkpoint --model SRC --out DST [--lora ADAPTER_DIR] [--dtype bfloat16]
        [--label-ids 32,33,34 | --recipe NAME] [--head-tensor lm_head.weight] [--max-length 16384]

What it does, one tensor at a time (peak host memory ~ the largest tensor in FP32, plus the adapter):

* reads every shard of SRC (``model.safetensors.index.json`` or ``*.safetensors``) with
  ``safetensors.safe_open`` and writes the same shard layout to DST with its own streaming writer: the
  header is computed from the source metadata first, then each tensor is loaded, transformed, written
  and dropped before the next one is read;
* optionally merges a PEFT-style LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``):
  ``W' = W + scale * B @ A`` with ``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA,
  ``rank_pattern``/``alpha_pattern`` honoured), computed in FP32 and only then rounded to the target
  dtype. Embedding LoRA (``lora_embedding_A/B``) and ``modules_to_save`` replacements are applied too.
  Every adapter tensor must land on a base tensor: an adapter that matches nothing is an error, never
  silently skipped. DoRA is refused;
* floating tensors are cast to the target dtype (BF16 by default); integer/bool tensors are kept;
* exports the selected rows of the LM head (the label token ids, given explicitly or read from the
  recipe's verbalizer through the checkpoint's tokenizer) in FP32, taken from the merged FP32 head
  before rounding, to ``decision_head.safetensors`` (``weight`` [n, hidden] float32, ``token_ids``
  [n] int64, labels in the metadata), or to the file and tensor names a family reads (``HeadFile``);
* copies config/tokenizer/chat-template files (``config.json``'s dtype is set to the target dtype),
  regenerates the shard index, and writes ``manifest.json`` last, listing every output file with its
  sha256 and size.

The output directory must not exist: the export is written into a sibling ``.<name>.partial``
directory and renamed into place only when complete, so a failed run leaves no output.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST_FORMAT = "jev-export/1"
HEAD_FILE = "decision_head.safetensors"


@dataclass(frozen=True)
class HeadFile:
    """Where the exported FP32 head rows go: the file, its rows tensor [n, hidden] and its token-id tensor [n]."""

    name: str = HEAD_FILE
    rows: str = "weight"
    ids: str = "token_ids"


INDEX_FILE = "model.safetensors.index.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors",)
COPY_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken", ".py", ".md")
COPY_NAMES = ("LICENSE", "NOTICE", "tokenizer.model", "vocab.txt", "merges.txt")
SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx")
PEFT_PREFIXES = ("base_model.model.", "base_model.")
HEAD_CANDIDATES = ("lm_head.weight", "model.language_model.lm_head.weight", "language_model.lm_head.weight")
TIED_CANDIDATES = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "transformer.wte.weight",
)

# safetensors dtype names <-> torch dtypes
_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
_TARGET_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


class ExportError(RuntimeError):
    """The inputs cannot be exported as asked (bad adapter, missing head, unknown label ...)."""


def _torch():
    import torch

    return torch


def _st_to_torch(name: str):
    return getattr(_torch(), _ST_DTYPES[name])


def _torch_to_st(dtype) -> str:
    for key, value in _ST_DTYPES.items():
        if getattr(_torch(), value) == dtype:
            return key
    raise ExportError(f"dtype {dtype} has no safetensors name")


def _itemsize(st_dtype: str) -> int:
    return _torch().empty((), dtype=_st_to_torch(st_dtype)).element_size()


def _is_float(st_dtype: str) -> bool:
    return st_dtype.startswith("F") or st_dtype == "BF16"


# --------------------------------------------------------------------------------------------------
# streaming safetensors writer


@dataclass
class _Entry:
    name: str
    dtype: str  # safetensors name
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


class StreamingSafetensorsWriter:
    """Writes a .safetensors file whose tensor list is known up front, one tensor at a time.

    The header (names, dtypes, shapes, offsets) is written first; ``write(name, tensor)`` must then be
    called once per entry, in the declared order, with a tensor of exactly the declared dtype and shape.
    """

    def __init__(self, path: Path, entries: list[_Entry], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.entries = entries
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        offset = 0
        for entry in entries:
            header[entry.name] = {
                "dtype": entry.dtype,
                "shape": list(entry.shape),
                "data_offsets": [offset, offset + entry.nbytes],
            }
            offset += entry.nbytes
        self.total_bytes = offset
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # the data buffer starts 8-byte aligned, as the reference writer does
        self._file = open(self.path, "wb")  # noqa: SIM115 - written in pieces until close()
        self._file.write(len(raw).to_bytes(8, "little"))
        self._file.write(raw)
        self._next = 0

    def write(self, name: str, tensor) -> None:
        torch = _torch()
        if self._next >= len(self.entries):
            raise ExportError(f"{self.path.name}: more tensors written than declared")
        entry = self.entries[self._next]
        if name != entry.name:
            raise ExportError(f"{self.path.name}: expected tensor {entry.name!r}, got {name!r}")
        if _torch_to_st(tensor.dtype) != entry.dtype or tuple(tensor.shape) != entry.shape:
            raise ExportError(
                f"{name}: declared {entry.dtype}{list(entry.shape)}, "
                f"got {_torch_to_st(tensor.dtype)}{list(tensor.shape)}"
            )
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        if flat.numel():
            data = flat.view(torch.uint8).numpy()
            if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
                raise ExportError("big-endian hosts are not supported")
            self._file.write(memoryview(data))
        self._next += 1

    def close(self) -> None:
        if self._next != len(self.entries):
            missing = [e.name for e in self.entries[self._next :]][:3]
            self._file.close()
            raise ExportError(f"{self.path.name}: {len(self.entries) - self._next} tensors never written ({missing})")
        self._file.close()


# --------------------------------------------------------------------------------------------------
# LoRA


@dataclass
class _LoraPair:
    module: str  # the base module name, e.g. model.layers.0.self_attn.q_proj
    kind: str  # "linear" | "embedding"
    a_key: str
    b_key: str
    scale: float


@dataclass
class LoraAdapter:
    path: Path
    config: dict
    weights_file: Path
    pairs: dict[str, _LoraPair] = field(default_factory=dict)  # base tensor name -> pair
    replacements: dict[str, str] = field(default_factory=dict)  # base tensor name -> adapter key
    fan_in_fan_out: bool = False

    @classmethod
    def load(cls, path: str | os.PathLike) -> LoraAdapter:
        from safetensors import safe_open

        path = Path(path)
        config_file = path / ADAPTER_CONFIG
        if not config_file.is_file():
            raise ExportError(f"{path}: no {ADAPTER_CONFIG} (a PEFT LoRA adapter folder is expected)")
        config = json.loads(config_file.read_text(encoding="utf-8"))
        peft_type = str(config.get("peft_type", "LORA")).upper()
        if peft_type != "LORA":
            raise ExportError(f"{path}: peft_type {peft_type!r} is not LORA")
        if config.get("use_dora"):
            raise ExportError(f"{path}: DoRA adapters are not supported (magnitude vectors cannot be merged this way)")
        weights = next((path / n for n in ADAPTER_WEIGHTS if (path / n).is_file()), None)
        if weights is None:
            raise ExportError(f"{path}: no adapter_model.safetensors")
        adapter = cls(
            path=path, config=config, weights_file=weights, fan_in_fan_out=bool(config.get("fan_in_fan_out", False))
        )
        with safe_open(str(weights), framework="pt") as handle:
            keys = list(handle.keys())
        adapter._index(keys)
        return adapter

    def _scale(self, module: str) -> float:
        r = int(self.config.get("r", 8))
        alpha = float(self.config.get("lora_alpha", r))
        for pattern, value in (self.config.get("rank_pattern") or {}).items():
            if _pattern_matches(pattern, module):
                r = int(value)
        for pattern, value in (self.config.get("alpha_pattern") or {}).items():
            if _pattern_matches(pattern, module):
                alpha = float(value)
        if r <= 0:
            raise ExportError(f"{self.path}: rank {r} for {module}")
        return alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r

    def _index(self, keys: Iterable[str]) -> None:
        linear_a = re.compile(r"^(?P<m>.+)\.lora_A(?:\.[^.]+)?\.weight$")
        embed_a = re.compile(r"^(?P<m>.+)\.lora_embedding_A(?:\.[^.]+)?$")
        save = re.compile(r"^(?P<m>.+)\.modules_to_save\.[^.]+\.(?P<p>[^.]+)$")
        keyset = set(keys)
        consumed: set[str] = set()
        for key in sorted(keyset):
            for regex, kind, b_of in (
                (linear_a, "linear", lambda k: k.replace(".lora_A", ".lora_B")),
                (embed_a, "embedding", lambda k: k.replace(".lora_embedding_A", ".lora_embedding_B")),
            ):
                match = regex.match(key)
                if not match:
                    continue
                b_key = b_of(key)
                if b_key not in keyset:
                    raise ExportError(f"{self.weights_file}: {key} has no matching {b_key}")
                module = _strip_peft(match.group("m"))
                self.pairs[module + ".weight"] = _LoraPair(module, kind, key, b_key, self._scale(module))
                consumed.update((key, b_key))
            match = save.match(key)
            if match:
                self.replacements[_strip_peft(match.group("m")) + "." + match.group("p")] = key
                consumed.add(key)
        leftover = sorted(keyset - consumed)
        if leftover:
            raise ExportError(f"{self.weights_file}: adapter tensors this exporter does not understand: {leftover[:5]}")
        if not self.pairs and not self.replacements:
            raise ExportError(f"{self.weights_file}: the adapter holds no LoRA tensors")

    def resolve(self, base_names: Iterable[str]) -> None:
        """Map adapter targets onto base tensor names: exact, else a unique suffix match."""
        base_names = list(base_names)
        base_set = set(base_names)

        def find(target: str) -> str:
            if target in base_set:
                return target
            hits = [n for n in base_names if n.endswith("." + target) or target.endswith("." + n)]
            if len(hits) == 1:
                return hits[0]
            if not hits:
                raise ExportError(f"LoRA target {target!r} matches no tensor of the base checkpoint")
            raise ExportError(f"LoRA target {target!r} is ambiguous: {hits[:4]}")

        self.pairs = {find(t): p for t, p in self.pairs.items()}
        self.replacements = {find(t): k for t, k in self.replacements.items()}
        clash = set(self.pairs) & set(self.replacements)
        if clash:
            raise ExportError(f"tensors both LoRA-adapted and replaced by modules_to_save: {sorted(clash)[:3]}")

    def summary(self) -> dict:
        scales = sorted({p.scale for p in self.pairs.values()})
        return {
            "path": str(self.path),
            "r": self.config.get("r"),
            "lora_alpha": self.config.get("lora_alpha"),
            "use_rslora": bool(self.config.get("use_rslora")),
            "scales": scales,
            "merged_tensors": len(self.pairs),
            "replaced_tensors": len(self.replacements),
            "base_model_name_or_path": self.config.get("base_model_name_or_path"),
        }


def _strip_peft(name: str) -> str:
    for prefix in PEFT_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _pattern_matches(pattern: str, module: str) -> bool:
    if module == pattern or module.endswith("." + pattern):
        return True
    try:
        return re.fullmatch(pattern, module) is not None or re.fullmatch(rf".*\.{pattern}", module) is not None
    except re.error:
        return False


def merge_lora_fp32(weight, a, b, scale: float, *, kind: str = "linear", fan_in_fan_out: bool = False):
    """The merged weight in FP32: W + scale * B @ A (embedding LoRA: W + scale * (B @ A)^T)."""
    torch = _torch()
    delta = b.to(torch.float32) @ a.to(torch.float32)
    if kind == "embedding" or fan_in_fan_out:
        delta = delta.T
    merged = weight.to(torch.float32) + scale * delta
    if merged.shape != weight.shape:
        raise ExportError(f"LoRA delta {list(delta.shape)} does not fit weight {list(weight.shape)}")
    return merged


# --------------------------------------------------------------------------------------------------
# labels


def label_token_ids(tokenizer_dir: str | os.PathLike, labels: list[str]) -> list[int]:
    """Token id of each label string; each must be exactly one token of the checkpoint's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = []
    for label in labels:
        encoded = tokenizer.encode(label, add_special_tokens=False)
        if len(encoded) != 1:
            raise ExportError(f"label {label!r} is {len(encoded)} tokens {encoded} in this tokenizer, not one")
        ids.append(int(encoded[0]))
    if len(set(ids)) != len(ids):
        raise ExportError(f"labels {labels} map to repeated token ids {ids}")
    return ids


def recipe_labels(recipe) -> list[str]:
    """The verbalizer's label strings in head-row order: one per option letter, then yes, then no.

    A recipe's ``verbalizer.label_prefix`` (e.g. " ", where the model writes " A") is put before each.
    """
    prefix = getattr(recipe.verbalizer, "label_prefix", "") or ""
    labels = list(recipe.verbalizer.labels)
    for extra in (recipe.verbalizer.yes, recipe.verbalizer.no):
        if extra not in labels:
            labels.append(extra)
    return [prefix + label for label in labels]


# --------------------------------------------------------------------------------------------------
# the export


def _source_shards(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = list(dict.fromkeys(weight_map.values()))  # keep first-seen order, dedupe
        shards = [model_dir / n for n in sorted(names)]
    else:
        shards = sorted(model_dir.glob("*.safetensors"))
        shards = [s for s in shards if s.name != HEAD_FILE]
    if not shards:
        raise ExportError(f"{model_dir}: no safetensors shards")
    for shard in shards:
        if not shard.is_file():
            raise ExportError(f"{model_dir}: index names {shard.name}, which is missing")
    return shards


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _load_tensor(handle, name: str):
    """One tensor from an open shard (a seam the tests use to check streaming)."""
    return handle.get_tensor(name)


def _find_head(names: set[str], requested: str | None, tie: bool) -> str:
    if requested:
        if requested not in names:
            raise ExportError(f"--head-tensor {requested!r} is not in the checkpoint")
        return requested
    for candidate in HEAD_CANDIDATES:
        if candidate in names:
            return candidate
    for candidate in TIED_CANDIDATES:
        if candidate in names:
            return candidate
    raise ExportError(
        "no LM head (lm_head.weight) or tied embedding found; pass --head-tensor"
        + ("" if tie else " (config does not declare tie_word_embeddings)")
    )


def _write_shards(
    layout: dict[Path, list[_Entry]],
    out: Path,
    adapter: LoraAdapter | None,
    head_name: str | None,
    label_ids: list[int] | None,
    log,
):
    """Stream every source shard into out/, one tensor at a time; returns (weight_map, bytes, head rows)."""
    torch = _torch()
    from safetensors import safe_open

    weight_map: dict[str, str] = {}
    total_size = 0
    head_rows = None
    with contextlib.ExitStack() as stack:
        adapter_handle = stack.enter_context(safe_open(str(adapter.weights_file), framework="pt")) if adapter else None
        for shard, entries in layout.items():
            writer = StreamingSafetensorsWriter(out / shard.name, entries, metadata={"format": "pt"})
            with safe_open(str(shard), framework="pt") as handle:
                for entry in entries:
                    tensor = _load_tensor(handle, entry.name)
                    if adapter and entry.name in adapter.replacements:
                        tensor = adapter_handle.get_tensor(adapter.replacements[entry.name])
                        if tuple(tensor.shape) != entry.shape:
                            raise ExportError(
                                f"modules_to_save {entry.name}: {list(tensor.shape)} does not fit {list(entry.shape)}"
                            )
                    pair = adapter.pairs.get(entry.name) if adapter else None
                    if pair is not None:
                        full = merge_lora_fp32(
                            tensor,
                            adapter_handle.get_tensor(pair.a_key),
                            adapter_handle.get_tensor(pair.b_key),
                            pair.scale,
                            kind=pair.kind,
                            fan_in_fan_out=adapter.fan_in_fan_out,
                        )
                    elif tensor.is_floating_point():
                        full = tensor.to(torch.float32)
                    else:
                        full = tensor
                    if entry.name == head_name:
                        rows = torch.tensor(label_ids, dtype=torch.long)
                        head_rows = full.to(torch.float32)[rows].clone()
                    result = full.to(_st_to_torch(entry.dtype)) if full.is_floating_point() else full
                    writer.write(entry.name, result)
                    del tensor, full, result  # nothing of this tensor outlives its write
            writer.close()
            weight_map.update({e.name: shard.name for e in entries})
            total_size += writer.total_bytes
            log(f"wrote {shard.name}: {len(entries)} tensors, {writer.total_bytes} bytes")
    return weight_map, total_size, head_rows


def export_checkpoint(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    lora_dir: str | os.PathLike | None = None,
    dtype: str = "bfloat16",
    label_ids: list[int] | None = None,
    labels: list[str] | None = None,
    recipe=None,
    head_tensor: str | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    extra_files: Iterable[str | os.PathLike] = (),
    max_length: int | None = None,
    head_file: HeadFile = HeadFile(),
    log=print,
) -> dict:
    """Export model_dir (+ LoRA) to out_dir; returns the manifest. See the module docstring."""
    torch = _torch()
    from safetensors import safe_open

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if dtype not in _TARGET_DTYPES:
        raise ExportError(f"dtype must be one of {sorted(_TARGET_DTYPES)}, got {dtype!r}")
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; the exporter never writes into an existing directory")
    if not model_dir.is_dir():
        raise ExportError(f"{model_dir} is not a directory")
    target_st = _TARGET_DTYPES[dtype]

    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    tie = bool(config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings", False)))

    # label token ids: explicit, or the recipe's (or given) label strings through the tokenizer
    label_strings: list[str] | None = None
    if label_ids is None and (labels is not None or recipe is not None):
        label_strings = list(labels) if labels is not None else recipe_labels(recipe)
        label_ids = label_token_ids(tokenizer_dir or model_dir, label_strings)
    if label_ids is not None:
        label_ids = [int(i) for i in label_ids]
        if len(set(label_ids)) != len(label_ids):
            raise ExportError(f"label ids repeat: {label_ids}")

    shards = _source_shards(model_dir)
    layout: dict[Path, list[_Entry]] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as handle:
            entries = []
            for name in handle.keys():
                view = handle.get_slice(name)
                src_dtype = view.get_dtype()
                out_dtype = target_st if _is_float(src_dtype) and not src_dtype.startswith("F8") else src_dtype
                entries.append(_Entry(name, out_dtype, tuple(view.get_shape())))
            layout[shard] = entries
    all_names = [e.name for entries in layout.values() for e in entries]
    if len(set(all_names)) != len(all_names):
        raise ExportError("a tensor name appears in more than one shard")

    adapter = LoraAdapter.load(lora_dir) if lora_dir is not None else None
    if adapter is not None:
        adapter.resolve(all_names)

    head_name = None
    if label_ids is not None:
        head_name = _find_head(set(all_names), head_tensor, tie)
        head_entry = next(e for es in layout.values() for e in es if e.name == head_name)
        vocab = head_entry.shape[0]
        bad = [i for i in label_ids if not 0 <= i < vocab]
        if bad:
            raise ExportError(f"label ids {bad} are outside the head's {vocab} rows")

    partial = out_dir.parent / f".{out_dir.name}.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        weight_map, total_size, head_rows = _write_shards(layout, partial, adapter, head_name, label_ids, log)

        if (model_dir / INDEX_FILE).is_file() or len(layout) > 1:
            index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
            (partial / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")

        head_info = None
        if label_ids is not None:
            from safetensors.torch import save_file

            metadata = {
                "format": "pt",
                "source_tensor": head_name,
                "token_ids": json.dumps(label_ids),
                "labels": json.dumps(label_strings) if label_strings else "null",
                "dtype": "float32",
            }
            save_file(
                {head_file.rows: head_rows.contiguous(), head_file.ids: torch.tensor(label_ids, dtype=torch.int64)},
                str(partial / head_file.name),
                metadata=metadata,
            )
            head_info = {
                "file": head_file.name,
                "source_tensor": head_name,
                "token_ids": label_ids,
                "labels": label_strings,
                "rows": len(label_ids),
                "hidden": int(head_rows.shape[1]),
            }

        copied = []
        for src in sorted(model_dir.iterdir()):
            if not src.is_file() or src.name in (INDEX_FILE, head_file.name, "manifest.json"):
                continue
            if src.suffix in SKIP_SUFFIXES:
                continue
            if src.suffix in COPY_SUFFIXES or src.name in COPY_NAMES:
                shutil.copy2(src, partial / src.name)
                copied.append(src.name)
        for extra in extra_files:
            extra = Path(extra)
            if (partial / extra.name).exists():
                raise ExportError(f"extra file {extra.name} would overwrite an exported file")
            shutil.copy2(extra, partial / extra.name)
            copied.append(extra.name)
        if (partial / "config.json").is_file():
            cfg = json.loads((partial / "config.json").read_text(encoding="utf-8"))
            for key in ("torch_dtype", "dtype"):
                if key in cfg:
                    cfg[key] = dtype
            if "torch_dtype" not in cfg and "dtype" not in cfg:
                cfg["dtype"] = dtype
            (partial / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

        files = []
        for path in sorted(p for p in partial.rglob("*") if p.is_file()):
            files.append(
                {"path": path.relative_to(partial).as_posix(), "sha256": _sha256(path), "size": path.stat().st_size}
            )
        manifest = {
            "format": MANIFEST_FORMAT,
            "source": {"model_dir": str(model_dir.resolve()), "shards": [s.name for s in shards]},
            "dtype": dtype,
            "lora": adapter.summary() if adapter else None,
            "decision_head": head_info,
            "max_length": max_length,
            "copied": copied,
            "files": files,
        }
        (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if out_dir.exists():  # raced by someone else while we worked
            raise FileExistsError(f"{out_dir} appeared during the export")
        partial.rename(out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log(f"exported {len(all_names)} tensors to {out_dir} ({dtype}; manifest lists {len(files)} files)")
    return manifest


def verify_manifest(out_dir: str | os.PathLike) -> list[str]:
    """Problems found re-hashing an export against its manifest (empty list: all files intact)."""
    out_dir = Path(out_dir)
    manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    problems = []
    listed = set()
    for item in manifest["files"]:
        path = out_dir / item["path"]
        listed.add(item["path"])
        if not path.is_file():
            problems.append(f"missing {item['path']}")
        elif path.stat().st_size != item["size"] or _sha256(path) != item["sha256"]:
            problems.append(f"changed {item['path']}")
    for path in out_dir.rglob("*"):
        rel = path.relative_to(out_dir).as_posix()
        if path.is_file() and rel != "manifest.json" and rel not in listed:
            problems.append(f"unlisted {rel}")
    return problems


# --------------------------------------------------------------------------------------------------
# thin per-recipe wrappers (recipes/<name>/export.py) call this


def head_ids_from_json(path: str | os.PathLike) -> list[int]:
    """Label token ids from a JSON head description: the first list of ints under a known key."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    stack = [data]
    while stack:
        node = stack.pop(0)
        if isinstance(node, dict):
            for key in ("token_ids", "label_token_ids", "letter_token_ids", "decision_token_ids", "rows", "ids"):
                value = node.get(key)
                if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
                    return [int(v) for v in value]
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    raise ExportError(
        f"{path}: no list of label token ids found (keys token_ids/label_token_ids/rows); pass --label-ids explicitly"
    )


def recipe_export_main(
    recipe: str,
    *,
    adapter_subdir: str | None = None,
    extra_globs: Iterable[str] = (),
    head_json: str | None = None,
    extras_subdir: str | None = None,
    extras_into: str = "adapter_extras",
    decision_head: bool = True,
    argv: list[str] | None = None,
) -> int:
    """CLI of a recipe's export.py: --base (checkpoint) [--adapter (downloaded adapter repo)] --out.

    The LoRA is ``<adapter>/<adapter_subdir>``; files matching ``extra_globs`` in ``<adapter>/<extras_subdir>``
    (default: the LoRA folder) are copied into ``<out>/<extras_into>/`` (``"."``: beside the weights, where a
    readout reads them); head rows come from --label-ids, else ``<adapter>/<head_json>``, else the recipe's
    verbalizer through the base tokenizer, unless ``decision_head`` is off (a checkpoint read by its own head).
    """
    from jev_common.recipe import load_recipe

    parser = argparse.ArgumentParser(
        description=f"Export a checkpoint for recipe {recipe} (tools/export_checkpoint.py)"
    )
    parser.add_argument("--base", required=True, help="base checkpoint folder (a local hub snapshot)")
    parser.add_argument(
        "--adapter", help="downloaded adapter repository folder" if adapter_subdir is not None else argparse.SUPPRESS
    )
    parser.add_argument("--out", required=True, help="output folder; must not exist")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_TARGET_DTYPES))
    parser.add_argument("--label-ids", type=_parse_ids, help="override the LM-head rows to export")
    parser.add_argument("--tokenizer", help="tokenizer folder for the recipe's labels (default: --base)")
    parser.add_argument("--max-length", type=int)
    args = parser.parse_args(argv)
    loaded = load_recipe(recipe)
    lora_dir = None
    extras: list[Path] = []
    if adapter_subdir is not None:
        if not args.adapter:
            parser.error("--adapter is required for this recipe")
        root = Path(args.adapter)
        lora_dir = root / adapter_subdir if adapter_subdir not in ("", ".") else root
        skip = {ADAPTER_CONFIG, *ADAPTER_WEIGHTS}
        extras_dir = root / extras_subdir if extras_subdir is not None else lora_dir
        for pattern in extra_globs:
            found = [p for p in sorted(extras_dir.glob(pattern)) if p.is_file() and p.name not in skip]
            if not found and not any(ch in pattern for ch in "*?["):
                parser.error(f"{extras_dir / pattern} is missing")
            extras.extend(found)
    label_ids = args.label_ids
    if label_ids is None and head_json and lora_dir is not None and (lora_dir / head_json).is_file():
        label_ids = head_ids_from_json(lora_dir / head_json)
    try:
        export_checkpoint(
            args.base,
            args.out,
            lora_dir=lora_dir,
            dtype=args.dtype,
            label_ids=label_ids,
            recipe=loaded if label_ids is None and decision_head else None,
            tokenizer_dir=args.tokenizer,
            max_length=args.max_length,
        )
        if extras:
            _add_extras(Path(args.out), extras, extras_into)
    except (ExportError, FileExistsError) as exc:
        print(f"export ({recipe}): {exc}", file=sys.stderr)
        return 2
    return 0


def _add_extras(out_dir: Path, extras: list[Path], into: str = "adapter_extras") -> None:
    """Copy adapter-side files (calibration, head configs) into out/<into>/ (never over an exported file) and
    re-list the manifest."""
    add_files(out_dir, {f"{into}/{extra.name}": extra for extra in dict.fromkeys(extras)})


def add_files(out_dir: str | os.PathLike, files: dict[str, Path]) -> None:
    """Copy `files` (path in the export -> source file) into a finished export and list them in its manifest."""
    out_dir = Path(out_dir)
    manifest_path = out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for relative, source in files.items():
        target = out_dir / relative
        if target.exists():
            raise ExportError(f"{relative} would overwrite an exported file")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        manifest["files"].append(
            {"path": target.relative_to(out_dir).as_posix(), "sha256": _sha256(target), "size": target.stat().st_size}
        )
    manifest["files"].sort(key=lambda item: item["path"])
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--label-ids wants comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.export_checkpoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="source checkpoint folder (safetensors)")
    parser.add_argument("--out", required=True, help="output folder; must not exist")
    parser.add_argument(
        "--lora", help="PEFT LoRA adapter folder to merge (adapter_config.json + adapter_model.safetensors)"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_TARGET_DTYPES))
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--label-ids", type=_parse_ids, help="LM-head rows to export, e.g. 32,33,34")
    group.add_argument("--recipe", help="take the labels from this recipe's verbalizer (name under recipes/ or a path)")
    group.add_argument("--labels", help="comma-separated label strings, each one token of the tokenizer")
    parser.add_argument("--tokenizer", help="tokenizer folder for --recipe/--labels (default: --model)")
    parser.add_argument("--head-tensor", help="LM-head tensor name (default: lm_head.weight, else the tied embedding)")
    parser.add_argument("--extra-file", action="append", default=[], help="copy this file into the export too")
    parser.add_argument("--max-length", type=int, help="recorded in the manifest for the serving side")
    parser.add_argument(
        "--verify", action="store_true", help="only re-hash an existing export (--out) against its manifest"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verify:
        problems = verify_manifest(args.out)
        for problem in problems:
            print(problem, file=sys.stderr)
        print("manifest: ok" if not problems else f"manifest: {len(problems)} problems")
        return 1 if problems else 0
    recipe = None
    if args.recipe:
        from jev_common.recipe import load_recipe

        recipe = load_recipe(args.recipe)
    try:
        export_checkpoint(
            args.model,
            args.out,
            lora_dir=args.lora,
            dtype=args.dtype,
            label_ids=args.label_ids,
            labels=args.labels.split(",") if args.labels else None,
            recipe=recipe,
            head_tensor=args.head_tensor,
            tokenizer_dir=args.tokenizer,
            extra_files=args.extra_file,
            max_length=args.max_length,
        )
    except (ExportError, FileExistsError) as exc:
        print(f"export_checkpoint: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
