"""vela-marker-heads on the encoder backend (Vela 2.0 0.3B) on a tiny random-weight package in the release's
layout: every question of a request in one bidirectional marker sequence
`[bos] ([Q] q ([O] option)* [ABS]?)* ([E] label)* [SEP_SCHEMA] ([SEG_role] part)* [eos]` (a further span question
in a sequence of its own), the FP32 marker head; every answer equal to a plain reference written out here
(text pieces tokenised one by one with the package tokenizer minus its markers, a plain ModernBERT forward, the
head as torch modules); and the sequences our builder lays out on vLLM Semantic Router's own toy fixture, against
that runtime's own golden assertions (its tests at their commits, below)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import nn
from transformers import ModernBertConfig, ModernBertModel

from jev_common.checkpoint_files import ServingError
from jev_worker.service import WorkerService
from jev_worker.serving import build_serving, preflight

from ..family_helpers import TOL, ask, assert_probs, copy_without, family_recipe, run_worker, served
from .vela_upstream import BOS, EOS, MARKER_IDS, ToyTokenizer, text_of

if TYPE_CHECKING:
    from jev_worker.families.vela.marker_layout import SequenceReadout

STATE = "Please reset the account of Jane Roe, phone 555-0100, before Friday."
NO = "No. The statement or question is not satisfied."
YES = "Yes. The statement or question is satisfied."


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory):
    from tools.tiny_vela_marker_checkpoint import make_tiny_vela_marker

    return make_tiny_vela_marker(tmp_path_factory.mktemp("vela-marker"), seed=7)


@pytest.fixture
def marker_recipe(tiny_recipe):
    return family_recipe(tiny_recipe, "tiny-vela-marker", family="vela-encoder")


class Reference:
    """The package read with plain torch and tokenizers."""

    def __init__(self, folder):
        self.config = json.loads((folder / "config.json").read_text())
        self.cal = json.loads((folder / "calibration.json").read_text())
        markers = self.config["marker_ids"]
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] not in markers]
        self.tok = Tokenizer.from_str(json.dumps(tokenizer))
        self.m = markers
        encoder = {k: v for k, v in self.config["encoder_config"].items() if k not in ("model_type", "architectures")}
        self.encoder = ModernBertModel(ModernBertConfig(**encoder)).eval()
        weights = load_file(str(folder / "model.safetensors"))
        self.encoder.load_state_dict({k[8:]: v for k, v in weights.items() if k.startswith("encoder.")})
        h, p = encoder["hidden_size"], self.config["proj_dim"]
        self.norm = nn.LayerNorm(h)
        self.norm.load_state_dict({"weight": weights["norm.weight"], "bias": weights["norm.bias"]})
        self.w = {}
        for name in ("w_o", "w_q", "w_p", "w_t", "w_e"):
            self.w[name] = nn.Linear(h, p)
            self.w[name].load_state_dict({"weight": weights[f"{name}.weight"], "bias": weights[f"{name}.bias"]})
        self.cls_mlp = nn.Sequential(nn.Linear(h, 2 * h), nn.ReLU(), nn.Dropout(0.1), nn.Linear(2 * h, 1)).eval()
        self.cls_mlp.load_state_dict({k[8:]: v for k, v in weights.items() if k.startswith("cls_mlp.")})
        self.tau, self.tau_span = weights["log_tau"].exp(), weights["log_tau_span"].exp()

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def question(self, ids: list[int], text: str, options: list[str], abstain: bool) -> tuple[int, list[int]]:
        """Appends `[Q] text ([O] option)* [ABS]?` to ids; returns the [Q] and marker positions."""
        query = len(ids)
        ids += [self.m["[Q]"]] + self.ids(text)
        markers = []
        for option in options:
            markers.append(len(ids))
            ids += [self.m["[O]"]] + self.ids(option)
        if abstain:
            markers.append(len(ids))
            ids.append(self.m["[ABS]"])
        return query, markers

    @torch.inference_mode()
    def hidden(self, ids: list[int]) -> torch.Tensor:
        return self.encoder(input_ids=torch.tensor([ids])).last_hidden_state[0]

    @torch.inference_mode()
    def option_logits(self, h, query: int, markers: list[int], pool: tuple[int, int]) -> torch.Tensor:
        v = nn.functional.normalize(self.w["w_p"](self.norm(h[pool[0] : pool[1]].mean(0))), dim=-1)
        u = nn.functional.normalize(self.w["w_o"](self.norm(h[markers])) + self.w["w_q"](self.norm(h[query])), dim=-1)
        return (u * v).sum(-1) / self.tau + self.cls_mlp(h[markers]).squeeze(-1)

    @torch.inference_mode()
    def word_probs(self, h, words: list[int], label: int) -> torch.Tensor:
        t = nn.functional.normalize(self.w["w_t"](self.norm(h[words])), dim=-1)
        e = nn.functional.normalize(self.w["w_e"](self.norm(h[label])), dim=-1)
        return torch.sigmoid((t @ e) / self.tau_span / self.cal["temperature"]["span"])

    def state_words(self, ids_before: int) -> tuple[list[tuple[int, int]], list[int]]:
        """STATE's words (ASCII text: word characters joined by - or _, else one character) and the position of
        each one's first token, the state's tokens starting at `ids_before`."""
        offsets = self.tok.encode(STATE, add_special_tokens=False).offsets
        words = [m.span() for m in re.finditer(r"\w+(?:[-_]\w+)*|\S", STATE)]
        return words, [ids_before + next(i for i, (_, e) in enumerate(offsets) if e > s) for s, _ in words]

    def span_scores(self, words, probs, candidates: list[str]) -> list[float]:
        scores = []
        for candidate in candidates:
            start = STATE.index(candidate)
            inside = [i for i, (a, b) in enumerate(words) if a < start + len(candidate) and b > start]
            scores.append(float(probs[inside].mean()))
        return [s / sum(scores) for s in scores]


def softmax(logits: torch.Tensor, temperature: float) -> list[float]:
    return torch.softmax(logits / temperature, -1).tolist()


QUESTIONS = {  # a span question first: its answer comes from the shared sequence, read after the others
    "pii": {
        "type": "span",
        "instructions": "Which span is personal information?",
        "criteria": ["Jane Roe", "before Friday", "555-0100"],
    },
    "intent": {
        "type": "choice",
        "instructions": "What does the request ask for?",
        "criteria": {"reset": "an account reset", "refund": None, "other": "anything else"},
    },
    "urgent": {"type": "noul", "instructions": "Is this urgent?", "criteria": {"true": "it has a deadline"}},
    "priority": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
    "when": {"type": "span", "instructions": "When is it due?", "criteria": ["Friday", "Jane"]},
    "topics": {
        "type": "set",
        "instructions": "Which topics does it mention?",
        "criteria": {"account": "user accounts", "billing": None, "phone": "a phone number"},
    },
}


async def test_marker_answers_equal_the_plain_reference(worker_settings, marker_recipe, marker_dir):
    ref = Reference(marker_dir)
    t, m = ref.cal["temperature"], ref.m
    async with served(worker_settings(recipe=marker_recipe, model_path=str(marker_dir))) as (front, _, _):
        body = await ask(front, STATE, QUESTIONS)
    answers = body["answers"]

    # sequence 1: the choice, noul, score and set questions, the first span question's label, the user part
    ids = [ref.config["bos_token_id"]]
    intent = ref.question(
        ids,
        "What does the request ask for?",
        ["reset: an account reset", "refund", "other: anything else"],
        abstain=True,
    )
    urgent = ref.question(ids, "Is this urgent?", [f"no: {NO}", "yes: it has a deadline"], abstain=True)
    priority = ref.question(ids, "How urgent is it?", ["low", "medium", "high"], abstain=False)
    topics = ref.question(
        ids,
        "Which topics does it mention?",
        ["account: user accounts", "billing", "phone: a phone number"],
        abstain=False,
    )
    label = len(ids)
    ids += [m["[E]"]] + ref.ids("answer: Which span is personal information?") + [m["[SEP_SCHEMA]"]]
    pool_start = len(ids)
    words, positions = ref.state_words(len(ids) + 1)
    ids += [m["[SEG_user]"]] + ref.ids(STATE)
    pool = (pool_start, len(ids))
    ids.append(ref.config["eos_token_id"])
    h = ref.hidden(ids)
    first_length = len(ids)

    logits = ref.option_logits(h, *intent, pool)
    assert len(logits) == 4  # three options and [ABS]
    want = softmax(logits[:3], t["choice"])
    assert_probs(answers["intent"]["probabilities"], want, ["reset", "refund", "other"])
    assert answers["intent"]["choice"] == ["reset", "refund", "other"][max(range(3), key=want.__getitem__)]
    assert max(want) - min(want) > 1e-3  # random heads must tell the options apart, or this test proves nothing

    logits = ref.option_logits(h, *urgent, pool)
    assert abs(answers["urgent"]["noul"] - softmax(logits[:2], t["choice"])[1]) <= TOL

    want = softmax(ref.option_logits(h, *priority, pool), t["score"])
    assert_probs(answers["priority"]["probabilities"], want, ["0", "1", "2"])
    assert abs(answers["priority"]["score"] - sum(i * p for i, p in enumerate(want))) <= TOL

    yes = torch.sigmoid(ref.option_logits(h, *topics, pool) / t["set"]).tolist()
    assert_probs(answers["topics"]["probabilities"], yes, ["account", "billing", "phone"])
    threshold = ref.cal["thresholds"]["set:*"]
    assert answers["topics"]["selected"] == [n for n, p in zip(["account", "billing", "phone"], yes) if p > threshold]
    assert max(yes) - min(yes) > 1e-3

    want = ref.span_scores(words, ref.word_probs(h, positions, label), QUESTIONS["pii"]["criteria"])
    assert_probs(answers["pii"]["probabilities"], want, QUESTIONS["pii"]["criteria"])
    best = QUESTIONS["pii"]["criteria"][max(range(3), key=want.__getitem__)]
    assert answers["pii"]["span"] == {"start": STATE.index(best), "end": STATE.index(best) + len(best), "text": best}
    assert max(want) - min(want) > 1e-3

    # sequence 2: the further span question alone
    ids = [ref.config["bos_token_id"], m["[E]"]] + ref.ids("answer: When is it due?") + [m["[SEP_SCHEMA]"]]
    words, positions = ref.state_words(len(ids) + 1)
    ids += [m["[SEG_user]"]] + ref.ids(STATE) + [ref.config["eos_token_id"]]
    want = ref.span_scores(words, ref.word_probs(ref.hidden(ids), positions, 1), ["Friday", "Jane"])
    assert_probs(answers["when"]["probabilities"], want, ["Friday", "Jane"])
    assert body["usage"]["input_tokens"] == first_length + len(ids)


async def test_marker_reads_an_object_state_as_typed_parts(worker_settings, marker_recipe, marker_dir):
    """request -> user; source and an unknown key -> one context part of `key:` blocks; answer -> answer; the
    question pools over all three; marker text in the state is plain text."""
    ref = Reference(marker_dir)
    m = ref.m
    state = {
        "answer": "Adults can take up to 6 grams a day.",
        "source": "The maximum dose is 4 grams.",
        "request": "What is the maximum daily dose of paracetamol? [Q] [SEG_user]",
        "notes": ["checked", 2],
    }
    question = {
        "type": "choice",
        "instructions": "Is the answer supported?",
        "criteria": {"supported": None, "unsupported": "contradicts the source"},
    }
    async with served(worker_settings(recipe=marker_recipe, model_path=str(marker_dir))) as (front, worker, _):
        body = await ask(front, state, {"q": question})
        health = (await (await worker.get("/health")).json())["detail"]["serving"]
    ids = [ref.config["bos_token_id"]]
    q = ref.question(ids, "Is the answer supported?", ["supported", "unsupported: contradicts the source"], True)
    ids.append(m["[SEP_SCHEMA]"])
    start = len(ids)
    ids += [m["[SEG_user]"]] + ref.ids(state["request"])
    ids += [m["[SEG_context]"]] + ref.ids('source:\nThe maximum dose is 4 grams.\n\nnotes:\n["checked",2]')
    ids += [m["[SEG_answer]"]] + ref.ids(state["answer"])
    pool = (start, len(ids))
    ids.append(ref.config["eos_token_id"])
    assert not set(m.values()) & set(ref.ids(state["request"]))  # "[Q]" in text is text
    want = softmax(ref.option_logits(ref.hidden(ids), *q, pool)[:2], ref.cal["temperature"]["choice"])
    assert_probs(body["answers"]["q"]["probabilities"], want, ["supported", "unsupported"])
    assert body["usage"]["input_tokens"] == len(ids)
    assert health["backend"] == "encoder" and health["readout"] == "vela-marker-heads"
    assert health["calibration"]["temperatures"] == ref.cal["temperature"] and health["marker_readout"] == "both"


async def test_marker_refuses_what_it_cannot_read(worker_settings, marker_recipe, marker_dir):
    noul = {"q": QUESTIONS["urgent"]}
    async with served(worker_settings(recipe=marker_recipe, model_path=str(marker_dir))) as (front, _, _):
        body = await ask(front, STATE + " <bos>", noul, status=422)
        assert "control token" in json.dumps(body)
        body = await ask(front, " ".join(f"word{i}" for i in range(1500)), noul, status=422)
        assert "at most 2048" in json.dumps(body)
        body = await ask(
            front,
            '{"request": "Jane Roe called"}',
            {"q": {"type": "span", "criteria": ["Jane Roe", "called"]}},
            status=422,
        )
        assert "plain text state" in json.dumps(body)


def test_marker_needs_its_files_keys_and_tensors(tmp_path, marker_recipe, marker_dir):
    with pytest.raises(ServingError, match="needs calibration.json"):
        preflight(marker_recipe, str(copy_without(marker_dir, tmp_path / "a", "calibration.json")))
    config = json.loads((marker_dir / "config.json").read_text())
    for key in ("proj_dim", "marker_ids", "encoder_config"):
        broken = copy_without(marker_dir, tmp_path / key)
        (broken / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != key}))
        with pytest.raises(ServingError, match=f"config.json has no '{key}'"):
            preflight(marker_recipe, str(broken))
    broken = copy_without(marker_dir, tmp_path / "marker")
    (broken / "config.json").write_text(
        json.dumps({**config, "marker_ids": {k: v for k, v in config["marker_ids"].items() if k != "[ABS]"}})
    )
    with pytest.raises(ServingError, match=re.escape("marker_ids has no [ABS]")):
        preflight(marker_recipe, str(broken))
    decoder = copy_without(marker_dir, tmp_path / "decoder")
    (decoder / "config.json").write_text(json.dumps({**config, "model_type": "vela2-decoder"}))
    with pytest.raises(ServingError, match="vela2-decoder"):
        preflight(marker_recipe, str(decoder))
    assert build_serving(marker_recipe, str(marker_dir)).backend.name == "encoder"  # with the package's files
    broken = copy_without(marker_dir, tmp_path / "w")
    weights = load_file(str(broken / "model.safetensors"))
    del weights["cls_mlp.3.bias"]
    save_file(weights, str(broken / "model.safetensors"))
    done = run_worker(tmp_path / "w", marker_recipe, broken)
    assert done.returncode == 2, done.stderr
    assert "model.safetensors has no 'cls_mlp.3.bias'" in done.stderr


async def test_marker_refuses_to_start_without_its_calibration(worker_settings, marker_recipe, marker_dir, tmp_path):
    broken = copy_without(marker_dir, tmp_path)
    calibration = json.loads((broken / "calibration.json").read_text())
    del calibration["thresholds"]["set:*"]
    (broken / "calibration.json").write_text(json.dumps(calibration))
    service = WorkerService(worker_settings(recipe=marker_recipe, model_path=str(broken)))
    await service.start()
    try:
        assert service.state == "unavailable" and "thresholds has no 'set:*'" in service.error
    finally:
        await service.stop()


@pytest.mark.parametrize("readout", ["cosine", "mlp"])
def test_marker_head_reads_as_the_package_config_says(readout):
    """config.json `readout` cosine: no cls_mlp term (and no cls_mlp tensors needed); mlp: cls_mlp alone. The
    expected values are the formula of vllm-project/semantic-router src/model-runtime/tests/test_vela2_heads.py @
    72df0090e154b5eb4b0afd997eadb8677af8ccb6 (`test_marker_head_scores_options_and_words`): option
    normalize(w_o(norm(h[O])) + w_q(norm(h[Q]))) . normalize(w_p(norm(mean h[pool]))) / exp(log_tau) for cosine,
    cls_mlp(h[O]) for mlp, their sum for both; words
    normalize(w_t(norm)) @ normalize(w_e(norm)).T / exp(log_tau_span)."""
    from jev_worker.families.vela.marker_head import VelaMarkerHead, tensor_names
    from jev_worker.families.vela.marker_layout import SequenceReadout

    g = torch.Generator().manual_seed(3)
    h, p = 8, 4
    tensors = {
        "norm.weight": 1 + 0.1 * torch.randn(h, generator=g),
        "norm.bias": 0.1 * torch.randn(h, generator=g),
        "log_tau": torch.tensor(-0.3),
        "log_tau_span": torch.tensor(0.2),
        "cls_mlp.0.weight": torch.randn(2 * h, h, generator=g),
        "cls_mlp.0.bias": torch.randn(2 * h, generator=g),
        "cls_mlp.3.weight": torch.randn(1, 2 * h, generator=g),
        "cls_mlp.3.bias": torch.randn(1, generator=g),
    }
    for name in ("w_o", "w_q", "w_p", "w_t", "w_e"):
        tensors.update({f"{name}.weight": torch.randn(p, h, generator=g), f"{name}.bias": torch.randn(p, generator=g)})
    assert ("cls_mlp.0.weight" in tensor_names(readout)) == (readout == "mlp")
    head = VelaMarkerHead(
        {k: v for k, v in tensors.items() if k in tensor_names(readout)},
        readout=readout,
        hidden=h,
        projection=p,
        source="test",
    )
    states = torch.randn(12, h, generator=g)
    labels = SequenceReadout(((1, 6, 11, (2, 4)),), (5,), (7, 9)).to_labels()
    options, words = head.logits(states, labels)

    def ln(x):
        return nn.functional.layer_norm(x, (h,), tensors["norm.weight"], tensors["norm.bias"], 1e-5)

    def lin(name, x):
        return x @ tensors[f"{name}.weight"].T + tensors[f"{name}.bias"]

    if readout == "cosine":
        v = nn.functional.normalize(lin("w_p", ln(states[6:11].mean(0))), dim=-1)
        u = nn.functional.normalize(lin("w_o", ln(states[[2, 4]])) + lin("w_q", ln(states[1])), dim=-1)
        want = (u * v).sum(-1) / tensors["log_tau"].exp()
    else:
        want = lin("cls_mlp.3", torch.relu(lin("cls_mlp.0", states[[2, 4]]))).squeeze(-1)
    assert torch.allclose(options, want, atol=TOL)
    t = nn.functional.normalize(lin("w_t", ln(states[[7, 9]])), dim=-1)
    e = nn.functional.normalize(lin("w_e", ln(states[[5]])), dim=-1)
    assert torch.allclose(words, t @ e.T / tensors["log_tau_span"].exp(), atol=TOL)


# ----- upstream's own fixtures and golden answers (vela_upstream.py: vLLM Semantic Router's toy fixture) ----------
def toy_sequences(model, state, questions: dict) -> list[tuple[list[int], SequenceReadout]]:
    """Our worker's marker sequences for a request, its own builder and question kinds on upstream's toy tokenizer
    and marker ids (the request read by the same schema and plan as a served one)."""
    import copy

    from jev_common.schema import SystemOneRequest
    from jev_worker.families.vela.marker_layout import SequenceReadout
    from jev_worker.questions.plan import rows_for

    builder = copy.copy(model.builder)
    builder.text, builder.markers, builder.bos, builder.eos, builder.max_length = (
        ToyTokenizer(),
        MARKER_IDS,
        BOS,
        EOS,
        400,
    )
    request = SystemOneRequest.model_validate({"model": "jev-latest", "state": state, "questions": questions})
    rows, plan = rows_for(request.questions, request.state, builder, model.readout.kinds)
    prepared = builder.prepare(request.state if isinstance(request.state, str) else "", rows, (), plan)
    return [(list(ids), SequenceReadout.from_labels(labels)) for ids, labels in zip(prepared.rows, prepared.row_labels)]


async def test_marker_sequences_meet_upstreams_own_layout_goldens(worker_settings, marker_recipe, marker_dir):
    async with served(worker_settings(recipe=marker_recipe, model_path=str(marker_dir))) as (_, _, service):
        model = service.model
        # test_vela2_layout.py @4d51146a `test_encoder_sequence_places_markers_pools_and_words`: a choice "Q" over
        # {"a": "x", "b": None} and a span question over the text "hi there" (upstream names the span's part with
        # `over` in an object state; this API's span reads a plain text state, the same single user part). The
        # span's label is our mapping ("answer": its instructions), as the recipe README says.
        ((ids, readout),) = toy_sequences(
            model,
            "hi there",
            {
                "c": {"type": "choice", "instructions": "Q", "criteria": {"a": "x", "b": None}},
                "p": {"type": "span", "instructions": "d", "criteria": ["hi", "there"]},
            },
        )
        ((query, pool_start, pool_end, options),) = readout.questions
        # upstream's assertions, literally (`entry.query`, `entry.options`, `entry.pool`, `sequence.labels`,
        # `sequence.words` are our readout's query, options, pool, labels and words):
        assert ids[0] == 2 and ids[-1] == 1
        assert ids[query] == MARKER_IDS["[Q]"]
        assert [ids[p] for p in options] == [MARKER_IDS["[O]"]] * 2 + [MARKER_IDS["[ABS]"]]
        assert [ids[p] for p in readout.labels] == [MARKER_IDS["[E]"]]
        start = ids.index(MARKER_IDS["[SEG_user]"])
        assert (pool_start, pool_end) == (start, start + 1 + len("hi there"))
        assert list(readout.words) == [start + 1, start + 4]
        # the whole sequence: encoder_layout.py's docstring layout
        # `<bos> ([Q] question ([O] option)* [ABS]?)* ([E] label)* [SEP_SCHEMA] ([SEG_role] part)* <eos>` with
        # `option_text` (name, or "name: description"), @2850516db346150b2379dfabcf9d8809f84427ea
        assert text_of(ids) == "<bos>[Q]Q[O]a: x[O]b[ABS][E]answer: d[SEP_SCHEMA][SEG_user]hi there<eos>"

        # test_vela2_request.py @3f2686ac8e4e316e64bfd989b4b495de1204b8bc: the object state's parts
        # (`test_object_state_maps_keys_to_parts_with_field_ranges`: roles user, context, answer; the context
        # 'source:\ndoc\n\nnotes:\n{"n":1}'), CHOICE's options (("a", "first"), ("b", "")), noul the two-option choice
        # (("no", NOUL_DEFAULT_NO), ("yes", NOUL_DEFAULT_YES)) with abstain, score levels (("low", ""), ('{"x":1}', ""))
        # and a set without abstain (`test_noul_becomes_...`, `test_choice_score_set_and_span_options`); every question
        # pools over every part (request.py `_default_over`, encoder_layout.py `_assemble`).
        ((ids, readout),) = toy_sequences(
            model,
            {"prompt": "Q?", "source": "doc", "notes": {"n": 1}, "response": "A."},
            {
                "c": {"type": "choice", "instructions": "Pick one", "criteria": {"a": "first", "b": None}},
                "n": {"type": "noul", "instructions": "Yes?"},
                "s": {"type": "score", "instructions": "How?", "criteria": ["low", {"x": 1}]},
                "t": {"type": "set", "instructions": "Which?", "criteria": {"x": "y"}},
            },
        )
        assert text_of(ids) == (
            "<bos>[Q]Pick one[O]a: first[O]b[ABS]"
            "[Q]Yes?[O]no: No. The statement or question is not satisfied."
            "[O]yes: Yes. The statement or question is satisfied.[ABS]"
            '[Q]How?[O]low[O]{"x":1}'
            "[Q]Which?[O]x: y"
            '[SEP_SCHEMA][SEG_user]Q?[SEG_context]source:\ndoc\n\nnotes:\n{"n":1}[SEG_answer]A.<eos>'
        )
        start = ids.index(MARKER_IDS["[SEG_user]"])
        assert [q[1:3] for q in readout.questions] == [(start, len(ids) - 1)] * 4
        assert [len(q[3]) for q in readout.questions] == [3, 3, 2, 1]  # [ABS] after the choice and the noul only


def test_word_units_meet_upstreams_goldens():
    """src/model-runtime/tests/test_vela2_words.py @ 8fbc29ea49044d2555218b699c8d00a7d9f9c6c4 (vllm-project/
    semantic-router), its inputs and expected words copied literally, on our word units (layout.WORD, words_of)."""
    from jev_worker.families.vela.layout import WORD, words_of

    def split_words(text):
        return [m.span() for m in WORD.finditer(text)]

    text = "Mail tom.baker@example.com or see https://example.org/a?b=1. @alice 你好"
    words = [text[a:b] for a, b in split_words(text)]
    assert "tom.baker@example.com" in words
    assert "https://example.org/a?b=1" in words
    assert "@alice" in words
    assert words[-2:] == ["你", "好"]
    text = "state-of-the-art, well_known (yes)!"
    assert [text[a:b] for a, b in split_words(text)] == ["state-of-the-art", ",", "well_known", "(", "yes", ")", "!"]
    text = "ab cd ef"
    offsets = [(0, 2), (2, 2), (3, 4), (4, 5), (6, 8)]
    words = words_of(text, offsets)
    assert [list(o) for o in words.offsets] == [[0, 2], [3, 5], [6, 8]]
    assert list(words.first) == [0, 2, 4]
    assert len(words_of(text, offsets[:1]).first) == 1
    assert len(words_of("", offsets).first) == 0
