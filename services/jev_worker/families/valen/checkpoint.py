"""Valen's checkpoint folder (Liuziyu77/Valen `valen/training/checkpoint.py`): `checkpoint.pt` + `config.json`.

`checkpoint.pt` is a torch pickle, read with `torch.load(weights_only=True)` only (a pickle that needs code
is refused). It holds the *trainable deltas* of a `ValenQwen` model, not the frozen Qwen3.5 base:

- `weights`: the state-dict entries of the parameters that were trained, by the model's own names:
  - `head.decision.weight`, `head.candidate.weight` [projection_dim, hidden]: the bilinear decision head;
  - `backbone.language_model.base_model.model.<path>.lora_A.default.weight` [r, in] and `...lora_B...`
    [out, r]: PEFT LoRA on every `nn.Linear` `<path>` of the Qwen3.5 language model (stages text, joint,
    vision_top), scaled by lora_alpha / lora_rank;
  - `backbone.visual.merger.*` (stages joint, vision_top) and `backbone.visual.blocks.<i>.*` for the last
    four vision blocks (vision_top): full replacement values;
- `base_manifest`: the base it was trained on (`repo`, `revision`, `weight_sha256` {file: sha256});
- optimizer / RNG / training state, which serving ignores.

The worker (backend valen-lora) merges the LoRA and writes the vision values; the preencoder writes the vision
values only, so that image embeddings are Valen's, not the stock base's.

`config.json` (flat, or sectioned `model` / `training` / `objective` as Valen's configs are, flattened the
same way) gives `stage`, `projection_dim`, `lora_rank`, `lora_alpha` and `max_length`; `head_type`, when
present, must be `bilinear` (the only head whose tensors are the two projections above).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass

import torch

from jev_common.checkpoint_files import ServingError, load_torch_state, read_json

CHECKPOINT, CONFIG = "checkpoint.pt", "config.json"
DECISION, CANDIDATE = "head.decision.weight", "head.candidate.weight"
LANGUAGE_PREFIX = "backbone.language_model.base_model.model."
VISUAL_PREFIX = "backbone.visual."
LORA_RE = re.compile(r"^(?P<path>.+)\.lora_(?P<half>[AB])\.default\.weight$")
CONFIG_KEYS = ("stage", "projection_dim", "lora_rank", "lora_alpha", "max_length")
STAGES = ("warmup", "text", "joint", "vision_top")
VISION_TOP_BLOCKS = 4


@dataclass(frozen=True)
class ValenCheckpoint:
    folder: str
    config: dict
    head: tuple[torch.Tensor, torch.Tensor]  # decision, candidate [projection_dim, hidden]
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]]  # language-model Linear path -> (A [r, in], B [out, r])
    visual: dict[str, torch.Tensor]  # vision-tower parameter name -> value
    base: dict

    @property
    def lora_scale(self) -> float:
        return float(self.config["lora_alpha"]) / float(self.config["lora_rank"])

    @property
    def max_length(self) -> int:
        return int(self.config["max_length"])


def flat_config(config: dict) -> dict:
    """Valen's sectioned config (`model`, `training`, `objective`) as the flat contract it is saved as."""
    flat = {k: v for k, v in config.items() if k not in ("model", "training", "objective")}
    for section in ("model", "training", "objective"):
        values = config.get(section) or {}
        if not isinstance(values, dict):
            raise ServingError(f"{CONFIG}: {section} must be an object")
        for key, value in values.items():
            if key in flat and flat[key] != value:
                raise ServingError(f"{CONFIG}: {key} differs between sections")
            flat[key] = value
    return flat


def _config(folder: str) -> dict:
    try:
        raw = read_json(os.path.join(folder, CONFIG))
    except ValueError as exc:
        raise ServingError(f"{CONFIG} in {folder} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ServingError(f"{CONFIG} in {folder} is not a JSON object")
    config = flat_config(raw)
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ServingError(f"{CONFIG} has no {', '.join(map(repr, missing))} (in {folder})")
    if config["stage"] not in STAGES:
        raise ServingError(f"{CONFIG}: stage {config['stage']!r} is not one of Valen's {', '.join(STAGES)}")
    if config.get("head_type", "bilinear") != "bilinear":
        raise ServingError(
            f"{CONFIG}: head_type {config['head_type']!r}; only Valen's bilinear decision head "
            "(head.decision / head.candidate) is served"
        )
    for key in ("projection_dim", "lora_rank", "max_length"):
        if isinstance(config[key], bool) or not isinstance(config[key], int) or config[key] <= 0:
            raise ServingError(f"{CONFIG}: {key} must be a positive integer, got {config[key]!r}")
    if isinstance(config["lora_alpha"], bool) or not isinstance(config["lora_alpha"], (int, float)):
        raise ServingError(f"{CONFIG}: lora_alpha must be a number, got {config['lora_alpha']!r}")
    return config


def _tensor(weights: dict, name: str) -> torch.Tensor:
    value = weights.get(name)
    if not isinstance(value, torch.Tensor):
        raise ServingError(f"{CHECKPOINT}: weights has no tensor {name!r}")
    return value


def _split(weights: dict, config: dict) -> tuple[dict, dict]:
    """The LoRA pairs and the vision-tower values; any other name is refused (the reference does too)."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    visual: dict[str, torch.Tensor] = {}
    for name, value in weights.items():
        if name in (DECISION, CANDIDATE):
            continue
        if not isinstance(value, torch.Tensor):
            raise ServingError(f"{CHECKPOINT}: weights[{name!r}] is not a tensor")
        match = LORA_RE.match(name[len(LANGUAGE_PREFIX) :]) if name.startswith(LANGUAGE_PREFIX) else None
        if match:
            halves.setdefault(match["path"], {})[match["half"]] = value
        elif name.startswith(VISUAL_PREFIX):
            visual[name[len(VISUAL_PREFIX) :]] = value
        else:
            raise ServingError(
                f"{CHECKPOINT}: weights has {name!r}, which is not a Valen decision-head, LoRA or vision-tower weight"
            )
    lora = {}
    for path, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise ServingError(f"{CHECKPOINT}: LoRA of {path!r} has only lora_{''.join(pair)}")
        a, b = pair["A"], pair["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != config["lora_rank"] or b.shape[1] != config["lora_rank"]:
            raise ServingError(
                f"{CHECKPOINT}: LoRA of {path!r} is A {tuple(a.shape)}, B {tuple(b.shape)}; "
                f"lora_rank is {config['lora_rank']}"
            )
        lora[path] = (a, b)
    stage = config["stage"]
    if stage != "warmup" and not lora:
        raise ServingError(f"{CHECKPOINT}: stage {stage!r} trains LoRA, but weights has no lora_A/lora_B tensors")
    if stage in ("joint", "vision_top") and not any(k.startswith("merger.") for k in visual):
        raise ServingError(
            f"{CHECKPOINT}: stage {stage!r} trains the visual merger, but weights has no "
            f"{VISUAL_PREFIX}merger.* tensors"
        )
    if stage == "vision_top" and not any(k.startswith("blocks.") for k in visual):
        raise ServingError(
            f"{CHECKPOINT}: stage 'vision_top' trains the last vision blocks, but weights has no "
            f"{VISUAL_PREFIX}blocks.* tensors"
        )
    return lora, visual


@functools.lru_cache(maxsize=1)
def _read(folder: str, stamp: tuple[int, int]) -> ValenCheckpoint:
    config = _config(folder)
    payload = load_torch_state(os.path.join(folder, CHECKPOINT))
    weights = payload.get("weights")
    if not isinstance(weights, dict):
        raise ServingError(f"{CHECKPOINT} has no 'weights' (the trained tensors by name)")
    decision, candidate = _tensor(weights, DECISION), _tensor(weights, CANDIDATE)
    projection = config["projection_dim"]
    if decision.dim() != 2 or decision.shape != candidate.shape or decision.shape[0] != projection:
        raise ServingError(
            f"{CHECKPOINT}: {DECISION} {tuple(decision.shape)} and {CANDIDATE} "
            f"{tuple(candidate.shape)} must both be [projection_dim={projection}, hidden]"
        )
    base = payload.get("base_manifest")
    if (
        not isinstance(base, dict)
        or not all(isinstance(base.get(k), str) for k in ("repo", "revision"))
        or not isinstance(base.get("weight_sha256"), dict)
        or not base["weight_sha256"]
    ):
        raise ServingError(
            f"{CHECKPOINT}: base_manifest must name the base (repo, revision) and its weight_sha256 {{file: sha256}}"
        )
    lora, visual = _split(weights, config)
    return ValenCheckpoint(folder, config, (decision, candidate), lora, visual, base)


def read_checkpoint(folder: str) -> ValenCheckpoint:
    """The folder's checkpoint, read once per file version (preflight and load share it)."""
    stat = os.stat(os.path.join(folder, CHECKPOINT))
    return _read(os.path.abspath(folder), (stat.st_mtime_ns, stat.st_size))


def forget_checkpoint() -> None:
    """Drop the cached tensors once they are in the model."""
    _read.cache_clear()


def verify_base(folder: str, checkpoint: ValenCheckpoint) -> None:
    """Every base weight file the checkpoint was trained on is in `folder` with its recorded sha256."""
    for name, expected in sorted(checkpoint.base["weight_sha256"].items()):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ServingError(
                f"the Valen base {checkpoint.base['repo']}@{checkpoint.base['revision']} in "
                f"{folder} has no {name} ({CHECKPOINT} base_manifest lists it)"
            )
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(8 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            raise ServingError(
                f"the Valen base file {path} has sha256 {digest.hexdigest()}, but {CHECKPOINT} was "
                f"trained on {expected}"
            )


def find_base(base: dict, base_path: str | None) -> str:
    """The base's folder: `base_path` (the recipe's serving option), else the local Hugging Face cache
    snapshot of the repo@revision that `base_manifest` names."""
    if base_path:
        if not os.path.isdir(base_path):
            raise ServingError(f"readout option base_path={base_path!r} is not a folder")
        return base_path
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(base["repo"], revision=base["revision"], local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any miss is "not in the local cache"
        raise ServingError(
            f"the Valen base {base['repo']}@{base['revision']} ({CHECKPOINT} base_manifest) is not in the local "
            f"Hugging Face cache; download it once with `hf download {base['repo']} --revision {base['revision']}` "
            f"or set the readout option base_path ({type(exc).__name__})"
        ) from None


@torch.no_grad()
def merge_lora(language: torch.nn.Module, checkpoint: ValenCheckpoint) -> None:
    """Merge the LoRA into the language model's Linear weights: W + alpha/r * B @ A, in FP32."""
    scale = checkpoint.lora_scale
    for path, (a, b) in checkpoint.lora.items():
        try:
            linear = language.get_submodule(path)
        except AttributeError:
            raise ServingError(f"{CHECKPOINT}: LoRA names {path!r}, which the base language model lacks") from None
        weight = linear.weight
        if not isinstance(linear, torch.nn.Linear) or weight.shape != (b.shape[0], a.shape[1]):
            raise ServingError(
                f"{CHECKPOINT}: LoRA of {path!r} (B @ A: {b.shape[0]} x {a.shape[1]}) does not fit "
                f"the base's {type(linear).__name__} {tuple(weight.shape)}"
            )
        merged = weight.float() + scale * (b.float().to(weight.device) @ a.float().to(weight.device))
        weight.copy_(merged.to(weight.dtype))


@torch.no_grad()
def load_visual(visual: torch.nn.Module, checkpoint: ValenCheckpoint) -> None:
    """Write the trained vision-tower values (last blocks, merger) over the base's."""
    params = dict(visual.named_parameters())
    for name, value in checkpoint.visual.items():
        target = params.get(name)
        if target is None or target.shape != value.shape:
            have = "none" if target is None else tuple(target.shape)
            raise ServingError(
                f"{CHECKPOINT}: {VISUAL_PREFIX}{name} {tuple(value.shape)} does not fit the base's "
                f"vision tower ({have})"
            )
        target.copy_(value.to(target.dtype))


def apply_deltas(model: torch.nn.Module, checkpoint: ValenCheckpoint) -> None:
    """Both deltas into a Qwen3_5ForConditionalGeneration: the LoRA merged, the vision values written."""
    merge_lora(model.model.language_model, checkpoint)
    load_visual(model.model.visual, checkpoint)
