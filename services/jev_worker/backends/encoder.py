"""encoder: a bidirectional encoder (ModernBERT and the like) run over whole sequences, no LM head.

Every row is one complete sequence (the readout's sequence builder lays it out; there is no state
prefix to reuse, since every position attends to every other): rows are right-padded into one
batch with an attention mask that hides the padding, and the readout's head receives each row's
final hidden states at every real position ([length, hidden], FP32), not only the last one.

Checkpoint layout: the encoder's configuration and tokenizer where its EncoderFiles say (the default,
Laya's: `encoder/config.json` and `tokenizer/`; Vela 2.0 0.3B's readout builds the backend with its own,
families/vela/encoder_files.py); either way the encoder's weights under the `encoder.` prefix of
`model.safetensors` (beside the readout's own tensors). Loaded with `AutoModel.from_config` + the state
dict: no checkpoint code is executed. A head may read several questions from one sequence: it then
returns one logits tensor per question, in the order its readout's sequence builder planned.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

import torch

from jev_common.checkpoint_files import ServingError

from ..loading.checkpoint import load_exactly, require_files
from ..loading.loader import LoadedModel, pick_device, pick_dtype, placed
from ..protocols import Backend, Engine
from ..scheduling.batch import BatchOutput, EngineResult

ENCODER_CONFIG = "encoder"
TOKENIZER = "tokenizer"
WEIGHTS = "model.safetensors"
PREFIX = "encoder."


class EncoderFiles(ABC):
    """Where a checkpoint keeps its encoder's configuration and tokenizer."""

    needed: tuple[str, ...]  # files the folder must hold (beside model.safetensors)
    config_source: str  # where the configuration comes from, for messages

    @abstractmethod
    def config(self, folder: str): ...

    @abstractmethod
    def tokenizer(self, folder: str): ...


class SplitFolders(EncoderFiles):
    """The default layout (Laya's): the encoder's config in `encoder/`, its tokenizer in `tokenizer/`."""

    needed = (os.path.join(ENCODER_CONFIG, "config.json"), os.path.join(TOKENIZER, "tokenizer_config.json"))
    config_source = "encoder/config.json"

    def config(self, folder: str):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(os.path.join(folder, ENCODER_CONFIG))

    def tokenizer(self, folder: str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.join(folder, TOKENIZER))


class EncoderEngine(Engine):
    """Whole-sequence rows in padded batches; each row's hidden states go to the readout's head."""

    def __init__(self, model, device, *, head, pad_id: int, max_batch_rows: int):
        self.model = model
        self.device = device
        self.head = head
        self.pad_id = pad_id
        self.max_batch_rows = max(1, max_batch_rows)  # no prefix state exists: the scheduler's L3 stays off

    def _hidden(self, rows: list[tuple[int, ...]]) -> list[torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
        return [out[i, : len(row)].float() for i, row in enumerate(rows)]

    @torch.inference_mode()
    def run(self, items, groups=()) -> BatchOutput:
        rows = [
            (i, row, labels)
            for i, item in enumerate(items)
            for row, labels in zip(item.prepared.rows, item.prepared.row_labels)
        ]
        logits: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(items))}
        for start in range(0, len(rows), self.max_batch_rows):
            chunk = rows[start : start + self.max_batch_rows]
            for (i, _, labels), hidden in zip(chunk, self._hidden([row for _, row, _ in chunk])):
                read = self.head.logits(hidden, labels)
                if isinstance(read, list):  # several questions read from one sequence
                    logits[i].extend(read)
                else:
                    logits[i].append(read)
        return BatchOutput([EngineResult(row_logits=logits[i], cached_tokens=0) for i in range(len(items))])


class Encoder(Backend):
    name = "encoder"
    prefix_reuse = (
        "none: an encoder's every position attends to the whole sequence, so each question's "
        "sequence runs whole (L3 off)"
    )

    def __init__(self, files: EncoderFiles | None = None):
        self.files = files if files is not None else SplitFolders()

    def check(self, recipe) -> None:
        if recipe.model.modality != "text":
            raise ServingError(
                f"backend {self.name!r} serves text recipes only; {recipe.name} is {recipe.model.modality}"
            )

    def l3_bytes(self, configured: int) -> int:
        return 0

    def load(self, recipe, folder: str, device: str, dtype: str, *, lm_head: bool) -> LoadedModel:
        from safetensors.torch import load_file
        from transformers import AutoModel

        files = self.files
        require_files(folder, (*files.needed, WEIGHTS), f"backend {self.name!r}")
        dev = pick_device(device)
        torch_dtype = pick_dtype(dtype, dev)
        model = AutoModel.from_config(files.config(folder), attn_implementation="sdpa")
        weights = load_file(os.path.join(folder, WEIGHTS))
        state = {key[len(PREFIX) :]: value for key, value in weights.items() if key.startswith(PREFIX)}
        load_exactly(model, state, source=f"{WEIGHTS} ({PREFIX!r})", fits=files.config_source)
        return LoadedModel(placed(model, dev, torch_dtype), files.tokenizer(folder), None, dev, torch_dtype, folder)

    def build(self, loaded, *, head, max_batch_rows: int, pad_id: int, **_) -> EncoderEngine:
        return EncoderEngine(loaded.model, loaded.device, head=head, pad_id=pad_id, max_batch_rows=max_batch_rows)
