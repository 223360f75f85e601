"""laya-heads on the encoder backend (Laya) on a tiny checkpoint in convaiinnovations/laya's layout:
one non-autoregressive pass per question over `[cls] question [sep] ([mask] option)* [sep] state [sep]`,
the decision layers and scorer at the [mask] markers, the checkpoint's (type, option-count)
temperature; every answer equal to a plain reference written out here after the PyPI package laya 0.3.20 (the
version the recipe pins; `common.py` `build_sequence`, `agent.py` `Agent._to_internal`)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer

from jev_common.checkpoint_files import ServingError
from jev_worker.serving import build_serving, preflight

from ..family_helpers import ask, assert_probs, copy_without, family_recipe, run_worker, served

STATE = "The kettle is whistling and steam comes out of its spout."


@pytest.fixture(scope="module")
def laya_dir(tmp_path_factory):
    from tools.tiny_family_checkpoints import make_tiny_laya

    return make_tiny_laya(tmp_path_factory.mktemp("laya"), seed=11)


@pytest.fixture
def laya_recipe(tiny_recipe):
    return family_recipe(tiny_recipe, "tiny-laya", family="laya")


class Reference:
    """The checkpoint read with plain torch: ModernBERT from encoder/config.json + `encoder.*`, then
    h + type_emb[t], pre-norm transformer layers, scorer at the markers, / T, softmax."""

    def __init__(self, folder):
        self.tok = AutoTokenizer.from_pretrained(folder / "tokenizer")
        weights = load_file(str(folder / "model.safetensors"))
        self.encoder = AutoModel.from_config(AutoConfig.from_pretrained(folder / "encoder"), attn_implementation="sdpa")
        self.encoder.load_state_dict({k[8:]: v for k, v in weights.items() if k.startswith("encoder.")})
        self.config = json.loads((folder / "rl_agent_config.json").read_text())
        d = self.encoder.config.hidden_size
        self.layers = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, 1, 4 * d, 0.0, batch_first=True, norm_first=True),
            self.config["head_layers"],
            enable_nested_tensor=False,
        )
        self.layers.load_state_dict({k[5:]: v for k, v in weights.items() if k.startswith("head.")})
        self.type_emb = weights["type_emb.weight"]
        self.scorer = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.scorer.load_state_dict({k[7:]: v for k, v in weights.items() if k.startswith("scorer.")})
        for m in (self.encoder, self.layers, self.scorer):
            m.eval()

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @torch.inference_mode()
    def probs(self, type_id: int, question: str, options: list[str], state: str, temperature: float) -> list[float]:
        ids = [self.tok.cls_token_id] + self.ids(question) + [self.tok.sep_token_id]
        markers = []
        for option in options:
            markers.append(len(ids))
            ids += [self.tok.mask_token_id] + self.ids(" " + option)
        ids += [self.tok.sep_token_id] + self.ids(state) + [self.tok.sep_token_id]
        h = self.encoder(input_ids=torch.tensor([ids])).last_hidden_state + self.type_emb[type_id]
        logits = self.scorer(self.layers(h)[0, markers]).squeeze(-1)
        return torch.softmax(logits / temperature, -1).tolist()


async def test_laya_answers_equal_the_plain_reference(worker_settings, laya_recipe, laya_dir):
    ref = Reference(laya_dir)
    state_object = {"device": "kettle", "sound": "whistling", "note": "très chaud"}
    async with served(worker_settings(recipe=laya_recipe, model_path=str(laya_dir))) as (front, worker, _):
        body = await ask(
            front,
            STATE,
            {
                "what": {
                    "type": "choice",
                    "instructions": "What is the kettle doing?",
                    "criteria": {"boiling": "water at 100 C", "cooling": None, "broken": None},
                },
                "two": {"type": "choice", "criteria": {"on": None, "off": None}},
                "level": {"type": "score", "instructions": "How hot is it?", "criteria": ["cold", "warm", "hot"]},
                "hot": {"type": "noul", "instructions": "The water is hot.", "criteria": {"true": "it is boiling"}},
            },
        )
        answers = body["answers"]
        # temperatures [choice 1.3, score 0.8, noul 1.1], bucket choice:3-5 -> 1.7
        want = ref.probs(
            0,
            "choice question: What is the kettle doing?",
            ["boiling: water at 100 C", "cooling", "broken"],
            STATE,
            1.7,
        )
        assert_probs(answers["what"]["probabilities"], want, ["boiling", "cooling", "broken"])
        assert answers["what"]["choice"] == ["boiling", "cooling", "broken"][max(range(3), key=want.__getitem__)]
        want = ref.probs(0, "choice question: Which option fits the state best?", ["on", "off"], STATE, 1.3)
        assert_probs(answers["two"]["probabilities"], want, ["on", "off"])
        want = ref.probs(
            1, "score question: How hot is it?", ["level 0: cold", "level 1: warm", "level 2: hot"], STATE, 0.8
        )
        assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2"])
        assert abs(answers["level"]["score"] - sum(i * p for i, p in enumerate(want))) <= 1e-5
        want = ref.probs(
            2,
            "noul question: The water is hot.",
            ["false: no, the statement does not hold", "true: it is boiling"],
            STATE,
            1.1,
        )
        assert abs(answers["hot"]["noul"] - want[1]) <= 1e-5
        assert body["usage"]["input_tokens"] > 0

        body = await ask(front, state_object, {"q": {"type": "noul", "instructions": "Is it loud?"}})
        want = ref.probs(
            2,
            "noul question: Is it loud?",
            ["false: no, the statement does not hold", "true: yes, the statement holds"],
            json.dumps(state_object, ensure_ascii=False),
            1.1,
        )
        assert abs(body["answers"]["q"]["noul"] - want[1]) <= 1e-5

        health = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert health["backend"] == "encoder" and health["readout"] == "laya-heads"
        assert health["calibration"]["temperature_by_options"] == {"choice:3-5": 1.7}
        stats = await (await worker.get("/v1/cache/stats")).json()
        assert "each question's sequence runs whole" in stats["prefix_reuse"]


async def test_laya_cuts_the_state_to_max_len(worker_settings, laya_recipe, laya_dir):
    ref = Reference(laya_dir)
    long_state = " ".join(f"word{i}" for i in range(700))
    async with served(worker_settings(recipe=laya_recipe, model_path=str(laya_dir))) as (front, _, _):
        body = await ask(
            front, long_state, {"q": {"type": "choice", "instructions": "Which?", "criteria": {"a": None, "b": None}}}
        )
    head = [ref.tok.cls_token_id] + ref.ids("choice question: Which?") + [ref.tok.sep_token_id]
    options = [ref.tok.mask_token_id] + ref.ids(" a") + [ref.tok.mask_token_id] + ref.ids(" b") + [ref.tok.sep_token_id]
    room = 512 - len(head) - len(options) - 1
    kept = ref.tok.decode(ref.ids(long_state)[:room])
    assert ref.ids(kept) == ref.ids(long_state)[:room]  # the cut decodes and re-encodes to itself
    want = ref.probs(0, "choice question: Which?", ["a", "b"], kept, 1.3)
    assert_probs(body["answers"]["q"]["probabilities"], want, ["a", "b"])
    assert body["usage"]["input_tokens"] == 512


@pytest.mark.parametrize(
    "question",
    [
        {"type": "set", "criteria": {"hot": None, "cold": None}},
        {"type": "span", "criteria": ["its spout", "The kettle"]},
    ],
)
async def test_laya_refuses_types_it_has_no_head_for(worker_settings, laya_recipe, laya_dir, question):
    async with served(worker_settings(recipe=laya_recipe, model_path=str(laya_dir))) as (front, _, _):
        body = await ask(front, STATE, {"q": question}, status=422)
        assert body["detail"]["error_type"] == "unsupported_question_type"
        body = await ask(front, STATE + " [SEP] injected", {"q": {"type": "noul", "instructions": "Hot?"}}, status=422)
        assert "[SEP]" in json.dumps(body)


def test_laya_needs_its_files_and_backend(tmp_path, laya_recipe, tiny_recipe, laya_dir):
    with pytest.raises(ServingError, match="needs rl_agent_config.json"):
        preflight(laya_recipe, str(copy_without(laya_dir, tmp_path, "rl_agent_config.json")))
    assert build_serving(laya_recipe, str(laya_dir)).backend.name == "encoder"  # the family's choice
    done = run_worker(tmp_path / "w", laya_recipe, copy_without(laya_dir, tmp_path / "w", "model.safetensors"))
    assert done.returncode == 2, done.stderr
    assert "needs model.safetensors" in done.stderr


async def test_laya_writes_null_instructions_as_laya_does(worker_settings, laya_recipe, laya_dir):
    """laya 0.3.20 (PyPI) `Agent._to_internal` (agent.py): instructions that are not text become
    `json.dumps(ins, ensure_ascii=False)`, so an explicit null is the text `null`, and `build_sequence` (common.py)
    writes the head as `"%s question: %s" % (type, ins)`: `choice question: null`, copied out literally. Absent
    instructions laya refuses (`no 'instructions'`); this API allows them, so the recipe's default is sent."""
    ref = Reference(laya_dir)
    criteria = {"on": None, "off": None}
    async with served(worker_settings(recipe=laya_recipe, model_path=str(laya_dir))) as (front, _, _):
        null = await ask(front, STATE, {"q": {"type": "choice", "instructions": None, "criteria": criteria}})
        absent = await ask(front, STATE, {"q": {"type": "choice", "criteria": criteria}})
    null, absent = null["answers"]["q"]["probabilities"], absent["answers"]["q"]["probabilities"]
    assert_probs(null, ref.probs(0, "choice question: null", ["on", "off"], STATE, 1.3), ["on", "off"])
    assert_probs(
        absent,
        ref.probs(0, "choice question: Which option fits the state best?", ["on", "off"], STATE, 1.3),
        ["on", "off"],
    )
    assert abs(null["on"] - absent["on"]) > 1e-6
