"""jev-vl on causal-lm (JEV-27B-VL) on a tiny Qwen3.5 vision-language checkpoint in the release's layout
(tools/tiny_jev_vl_checkpoint.py: calibration.json, adapter_vllm/decision_head.json, label_head.safetensors):
every answer equal to upstream's System 1, written out here from

- `serve_decide.py` of autotrust/JEV-27B-VL@f34b598d4ef4bcefd337bee8d8e7ddd3b7733ccc (the reference the native
  port names in ThinkFlowLab/system1-omni THIRD_PARTY_NOTICES.md; code index file 71370323421): `setup`'s
  `single_token_labels` and calibration defaults, `_parts`, `_softmax`, `s1_pass`, `decide`;
- ThinkFlowLab/system1-omni `tests/jev_vl/contract.rs`@28083ead5e614618ee53a3c0626d0e4ef5b8b8c7 (the golden
  prompts) and `tests/jev_vl/readout.rs`@28083ead (the readout formula's numeric pin);
  `src/models/jev_vl/native/src/processing.rs`@8f81355252d9e328f04967e07a668fb59a6eb08d (the length refusal),
  `recipe/jev_vl/export_merged.py`@28083ead (the merged FP32 label rows).

The network is a plain transformers forward (the processor expands each image for image states); the
probabilities are s1_pass's formula over the merged rows as the native executor reads them (rows · h). The
System One envelope's mapping onto upstream's kinds is ours (recipes/jev-27b-vl/README.md), written out here
as `as_decide`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import string
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoTokenizer

from jev_common.checkpoint_files import ServingError
from jev_common.errors import InvalidRequest, TooManyOptions
from jev_common.recipe import REPO_ROOT, load_recipe
from jev_common.vl import load_vl_processor
from jev_worker.families.registry import build_readout

from ..family_helpers import TOL, ask, served
from ..vl_helpers import pattern_image, png_uri, request_line

# ===== upstream, written out =======================================================================
# serve_decide.py (autotrust/JEV-27B-VL@f34b598d)
MAX_OPTIONS = 256
PROFILE_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # PROFILES["qwen"]["image"]


def single_token_labels(tok, context):  # setup()'s inner function, verbatim
    out = []
    for lab in list(string.ascii_uppercase) + [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]:
        t = tok.encode(lab, add_special_tokens=False)
        if len(t) == 1 and t[0] in tok.encode(context.format(lab), add_special_tokens=False):
            out.append((lab, t[0]))
        if len(out) == MAX_OPTIONS:
            break
    return out


def _parts(state):  # verbatim
    if isinstance(state, str):
        return [{"type": "text", "text": state}], False
    if isinstance(state, dict):
        return [{"type": "text", "text": json.dumps(state, ensure_ascii=False)}], False
    out, img = [], False
    for p in state:
        if isinstance(p, str):
            out.append({"type": "text", "text": p})
        elif isinstance(p, dict) and "image" in p:
            out.append({"type": "image_url", "image_url": {"url": p["image"]}})
            img = True
        elif isinstance(p, dict) and p.get("type") == "image_url":
            out.append(p)
            img = True
        elif isinstance(p, dict) and p.get("type") == "text":
            out.append(p)
        else:
            out.append({"type": "text", "text": json.dumps(p, ensure_ascii=False)})
    return out, img


def _softmax(z):  # verbatim
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = sum(e)
    return [x / s for x in e]


def s1_content(kind, parts, question, opts, labels):
    """s1_pass's content (prof["prefix"] is "" for the Qwen profile)."""
    if kind == "choice":
        lines = [f"{labels[i]}) {o}" for i, o in enumerate(opts)]
    else:
        lines = opts
    return (
        [{"type": "text", "text": f"[kind] {kind}\n[state] "}]
        + parts
        + [{"type": "text", "text": f"\n[question] {question}\n[options]\n" + "\n".join(lines) + "\n[decision]:"}]
    )


def rendered(content) -> str:
    """The text vLLM tokenises (add_special_tokens=False): the text path joins the parts' text; the image
    path's raw chat template writes each image part as PROFILE_IMAGE, which the processor expands."""
    return "".join(c["text"] if c["type"] == "text" else PROFILE_IMAGE for c in content)


def decide_options(body, labels):
    """decide()'s candidates and its option-count refusal."""
    if body["kind"] == "choice":
        opts = body.get("options") or []
        if not 2 <= len(opts) <= len(labels):
            raise ValueError(f"choice needs 2-{len(labels)} options, got {len(opts)}")
        return opts
    return ["false", "true"] if body["kind"] == "noul" else [str(i) for i in range(6)]


def too_long(max_length, t):  # processing.rs's refusal (vLLM's words)
    return (
        f"This model's maximum context length is {max_length} tokens. However, you requested 1 output tokens and "
        f"your prompt contains at least {t} input tokens, for a total of at least {t + 1} tokens. Please reduce the "
        f"length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value={t})"
    )


class Upstream:
    """serve_decide.py's System 1 on a checkpoint folder: the prompt tokenised without special tokens (with
    images: the processor, which expands each image pad), a plain forward, then s1_pass's formula. Logits,
    not logprobs: softmax((logprob + b) / T) is the same (logZ is one constant per request). The rows are the
    export's merged FP32 `label_head.safetensors` (rows · h, as the native executor computes them), or the
    model's own logits without that file."""

    def __init__(self, folder, images: dict | None = None):
        folder = Path(folder)
        self.processor = load_vl_processor(str(folder))
        self.tok = self.processor.tokenizer
        self.model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        self.head = json.loads((folder / "adapter_vllm" / "decision_head.json").read_text())
        calib = folder / "calibration.json"  # setup(): calibration.json beside the adapter directory
        self.temps = (
            json.loads(calib.read_text())["per_kind"] if calib.exists() else {"noul": 1.0, "score": 1.0, "choice": 1.0}
        )
        self.temps.setdefault("score", 1.0)
        dec = single_token_labels(self.tok, "x\n{}) y")
        lo, hi = self.head["slots"]["ranges"]["choice"]
        assert [t for _, t in dec[: hi - lo]] == self.head["verbalizer_ids"][lo:hi], (
            "first labels must be the trained A-P head"
        )
        self.labels, self.label_ids = [label for label, _ in dec], [t for _, t in dec]
        self.rows = None
        if (folder / "label_head.safetensors").exists():
            tensors = load_file(str(folder / "label_head.safetensors"))
            self.rows = dict(zip(tensors["ids"].tolist(), tensors["rows"]))
        self.images = images or {}

    @torch.inference_mode()
    def decide(self, body) -> tuple[list[int], list[float]]:
        """(the prompt's token ids, s1_pass's probabilities) of an upstream request body."""
        kind, opts = body["kind"], decide_options(body, self.labels)
        parts, has_img = _parts(body.get("state", ""))
        head = self.head
        lo, hi = head["slots"]["ranges"][kind]
        if kind == "choice":
            n = len(opts)
            ids = self.label_ids[:n]
            bias = [head["bias"][lo + i] if lo + i < hi else 0.0 for i in range(n)]
        else:
            ids = head["verbalizer_ids"][lo:hi]
            bias = head["bias"][lo:hi]
        text = rendered(s1_content(kind, parts, body["question"], opts, self.labels))
        if has_img:
            images = [self.images[c["image_url"]["url"]] for c in parts if c["type"] == "image_url"]
            inputs = dict(self.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False))
            inputs.pop("attention_mask")
        else:
            inputs = {"input_ids": torch.tensor([self.tok(text, add_special_tokens=False)["input_ids"]])}
        if self.rows is not None:
            h = self.model.model(**inputs, use_cache=False).last_hidden_state[0, -1].double()
            logits = [float(self.rows[t].double() @ h) for t in ids]
        else:
            out = self.model(**inputs, use_cache=False).logits[0, -1].double()
            logits = [float(out[t]) for t in ids]
        return inputs["input_ids"][0].tolist(), _softmax([(lp + b) / self.temps[kind] for lp, b in zip(logits, bias)])


# ===== our envelope mapping (recipes/jev-27b-vl/README.md) ===========================================
def _text(value):
    return "" if value is None else value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def as_decide(question: dict, state) -> dict:
    """The upstream request a System One question is asked as (state already in upstream's form)."""
    body = {"kind": question["type"], "state": state, "question": _text(question.get("instructions"))}
    if question["type"] == "choice":
        body["options"] = [name if d is None else _text(d) for name, d in question["criteria"].items()]
    return body


# ===== the served side ==============================================================================
SEEDS, SIZE = (3, 4), (64, 64)  # 64x64: a [1, 4, 4] grid, 4 image tokens
URIS = {seed: png_uri(seed, SIZE) for seed in SEEDS}
TEXT_STATE = "Dialog: Update installed. Restart now or later?"
OBJECT_STATE = {"screen": "settings", "dialog": {"title": "Restart?", "buttons": ["Now", "Later"]}, "note": "très"}
LIST_STATE = ["Dialog: ", {"type": "text", "text": "Update installed."}, 7, {"buttons": ["Now", "Later"]}, " Go?"]


@pytest.fixture(scope="module")
def jev_dir(tmp_path_factory) -> Path:
    from tools.tiny_jev_vl_checkpoint import make_tiny_jev_vl

    return make_tiny_jev_vl(tmp_path_factory.mktemp("jev-vl") / "model")


@pytest.fixture(scope="module")
def upstream(jev_dir) -> Upstream:
    return Upstream(jev_dir, {uri: pattern_image(seed, SIZE) for seed, uri in URIS.items()})


@pytest.fixture
async def asset_dir(jev_dir, tmp_path) -> str:
    from jev_preencoder.encode import Encoder
    from jev_preencoder.settings import PreencoderSettings

    folder = tmp_path / "assets"
    encoder = Encoder(PreencoderSettings(model_path=str(jev_dir), device="cpu", dtype="float32", redis_url="none"))
    summary = await encoder.encode_lines([request_line(uri) for uri in URIS.values()], str(folder), None)
    assert summary.done == len(URIS), summary.results
    return str(folder)


def jev_recipe(**options):
    recipe = load_recipe("jev-27b-vl")
    assert recipe.serving.family == "jev-vl"
    model = recipe.model.model_copy(update={"hub_repo": "test/tiny-jev-vl", "revision": "local", "dtype": "float32"})
    serving = recipe.serving.model_copy(update={"options": options})
    return recipe.model_copy(update={"name": "tiny-jev-vl", "model": model, "serving": serving})


def record_sequences(service) -> list[tuple[int, ...]]:
    """Every row's whole token sequence (prefix + row) the engine is given from now on."""
    seen: list[tuple[int, ...]] = []
    engine = service.model.engine
    original = engine.run

    def run(items, groups):
        seen.extend(tuple(item.prepared.prefix_ids + row) for item in items for row in item.prepared.rows)
        return original(items, groups)

    engine.run = run
    return seen


async def decide(front, body, status=200) -> dict:
    response = await front.post("/v1/systemone", json=body)
    answer = await response.json()
    assert response.status == status, answer
    return answer


def assert_close(served, want):
    assert len(served) == len(want)
    assert max(abs(a - b) for a, b in zip(served, want)) <= TOL, (served, want)


# ===== tests ========================================================================================
def test_prompt_text_is_upstreams_golden_prompts(jev_dir):
    """The reference above, and the family's own contract, give system1-omni's golden prompts."""
    from jev_worker.families.jev_vl.contract import choice_lines, head_text, state_parts, tail_text

    labels = [label for label, _ in single_token_labels(AutoTokenizer.from_pretrained(jev_dir), "x\n{}) y")]
    golden = {  # tests/jev_vl/contract.rs
        (
            "noul",
            "Dialog: Update installed.",
            "Close it?",
            None,
        ): "[kind] noul\n[state] Dialog: Update installed.\n[question] Close it?\n[options]\nfalse\ntrue\n[decision]:",
        (
            "score",
            "x",
            "Rate it.",
            None,
        ): "[kind] score\n[state] x\n[question] Rate it.\n[options]\n0\n1\n2\n3\n4\n5\n[decision]:",
        (
            "choice",
            "Dialog: x.",
            "Pick one.",
            ("yes", "no", "later"),
        ): "[kind] choice\n[state] Dialog: x.\n[question] Pick one.\n[options]\nA) yes\nB) no\nC) later\n[decision]:",
    }
    for (kind, state, question, options), prompt in golden.items():
        body = {"kind": kind, "state": state, "question": question, **({"options": list(options)} if options else {})}
        opts = decide_options(body, labels)
        assert rendered(s1_content(kind, _parts(state)[0], question, opts, labels)) == prompt
        lines = choice_lines(opts, labels) if kind == "choice" else opts
        assert head_text(kind, state) + tail_text(question, lines) == prompt
    for state, inside in (
        ({"b": 1, "a": "x"}, '[state] {"b": 1, "a": "x"}\n'),
        (["one", "two", {"type": "text", "text": "three"}], "[state] onetwothree\n"),
        (["shot", {"image": "https://x/y.png"}], f"[state] shot{PROFILE_IMAGE}\n"),
        (["shot", {"type": "image_url", "image_url": {"url": "https://x/y.png"}}], f"[state] shot{PROFILE_IMAGE}\n"),
    ):
        assert inside in rendered(s1_content("noul", _parts(state)[0], "q?", ["false", "true"], labels))
        ours = "".join(v if k == "text" else PROFILE_IMAGE for k, v in state_parts(state))
        assert inside in head_text("noul", ours) + tail_text("q?", ["false", "true"])
    assert labels[:3] == ["A", "B", "C"] and len(labels) == 256

    # tests/jev_vl/readout.rs: rows[t][i] = ((t*64+i)*5 % 11 - 5) / 7, hidden[i] = (i*7 % 13 - 6) / 9
    rows = [[float((((t * 64 + i) * 5 % 11) - 5) / 7) for i in range(64)] for t in range(3)]
    hidden = [float(((i * 7 % 13) - 6) / 9) for i in range(64)]
    logits = [
        sum(
            float(torch.tensor(r, dtype=torch.float32)[i]) * float(torch.tensor(hidden, dtype=torch.float32)[i])
            for i in range(64)
        )
        for r in rows
    ]
    probs = _softmax([(lp + b) / 1.0143134751376188 for lp, b in zip(logits, [0.001, -0.002, 0.0005])])
    for p, e in zip(probs, [0.6256388379121548, 0.1869499071806715, 0.18741125490717364]):
        assert abs(p - e) < 1e-12
    from jev_worker.families.jev_vl.readout import softmax

    assert softmax([1.0, 2.0, -3.0]) == _softmax([1.0, 2.0, -3.0])


async def test_single_question_form_is_upstreams_decide(worker_settings, jev_dir, upstream):
    settings = worker_settings(recipe=jev_recipe(), model_path=str(jev_dir))
    async with served(settings) as (front, worker, service):
        sequences = record_sequences(service)
        many = [f"option {i}" for i in range(20)]  # labels past P: no slot bias
        bodies = [
            {"kind": "noul", "state": state, "question": "Should the dialog be closed?"}
            for state in (TEXT_STATE, OBJECT_STATE, LIST_STATE)
        ]
        bodies += [
            {"kind": "score", "state": state, "question": "How urgent is a restart?"}
            for state in (TEXT_STATE, OBJECT_STATE, LIST_STATE)
        ]
        bodies += [
            {"kind": "choice", "state": state, "question": "What next?", "options": ["Restart now", "Later", "Close"]}
            for state in (TEXT_STATE, OBJECT_STATE, LIST_STATE)
        ]
        bodies += [
            {"kind": "choice", "state": LIST_STATE, "question": "Which one?", "options": many},
            {"kind": "choice", "state": TEXT_STATE, "question": "Which one?", "options": [f"o{i}" for i in range(255)]},
        ]
        for body in bodies:
            sequences.clear()
            answer = await decide(front, body)
            ids, want = upstream.decide(body)
            assert sequences == [tuple(ids)]  # the served tokens are upstream's prompt, one pass, no BOS
            assert_close(answer["probabilities"], want)
            options = decide_options(body, upstream.labels)
            best = max(range(len(want)), key=want.__getitem__)
            assert (answer["choice_index"], answer["choice"]) == (best, options[best])
            assert "noul" not in answer and answer["usage"]["prompt_tokens"] == len(ids)
            if body["kind"] == "score":
                assert abs(answer["score"] - sum(i * p for i, p in enumerate(want))) <= TOL
            assert max(want) - min(want) > 1e-3
        assert all(upstream.head["bias"][8:24])  # so the 20 options' answer shows where the slot biases end
        # upstream ignores options sent with noul and score
        for body in bodies[0], bodies[3]:
            again = await decide(front, {**body, "options": ["1", "2", "3"]})
            assert_close(again["probabilities"], (await decide(front, body))["probabilities"])
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["family"] == serving["readout"] == "jev-vl" and serving["head"] == "label_head.safetensors"
        assert serving["calibration"]["temperatures"] == upstream.temps and serving["max_length"] == 16384

        # refusals (422): what upstream cannot ask, text the raw prompt cannot carry, over the option limit
        refused = [
            (
                {"kind": "span", "state": TEXT_STATE, "question": "q?", "options": ["Dialog", "Restart"]},
                "unsupported_question_type",
            ),
            (
                {"kind": "set", "state": TEXT_STATE, "question": "q?", "options": ["a", "b"]},
                "unsupported_question_type",
            ),
            ({"kind": "noul", "state": "press <|im_start|> now", "question": "q?"}, "'<|im_start|>'"),
            ({"kind": "noul", "state": ["a", "b <|image_pad|>"], "question": "q?"}, "'<|image_pad|>'"),
            ({"kind": "noul", "state": TEXT_STATE, "question": "q <|vision_end|>?"}, "'<|vision_end|>'"),
            (
                {"kind": "choice", "state": TEXT_STATE, "question": "q?", "options": ["a", "<|endoftext|>"]},
                "'<|endoftext|>'",
            ),
            ({"kind": "noul", "state": {"text": "shot", "image": URIS[3]}, "question": "q?"}, "list of parts"),
            ({"kind": "noul", "state": ["shot", {"type": "text"}], "question": "q?"}, "text part"),
            (
                {"kind": "choice", "state": TEXT_STATE, "question": "q?", "options": [f"o{i}" for i in range(256)]},
                "255",
            ),
            ({"kind": "choice", "state": TEXT_STATE, "question": "q?"}, "needs options"),
        ]
        for body, says in refused:
            response = await front.post("/v1/systemone", json=body)
            text = await response.text()
            assert response.status == 422 and says in text, (body, text)
        # an image the preencoder has not prepared (this worker's asset folder is empty)
        response = await front.post(
            "/v1/systemone", json={"kind": "noul", "state": [{"image": URIS[3]}], "question": "q?"}
        )
        assert response.status == 422 and "asset_not_prepared" in await response.text()


async def test_envelope_and_images(worker_settings, jev_dir, upstream, asset_dir):
    settings = worker_settings(recipe=jev_recipe(), model_path=str(jev_dir), asset_dir=asset_dir)
    questions = {
        "restart": {"type": "noul", "instructions": "Should it restart now?"},
        "next": {
            "type": "choice",
            "instructions": {"goal": "next step"},
            "criteria": {"now": "Restart now", "later": None, "close": {"action": "close"}},
        },
        "bare": {"type": "choice", "criteria": {"yes": None, "no": None}},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": [f"level {i}" for i in range(6)]},
        "also": {"type": "noul", "instructions": "Is a dialog open?", "criteria": {"true": None}},
    }
    assets = {
        f"<image:{s}>": {"type": "image", "format": "png", "data_base64": URIS[s].split(",", 1)[1]} for s in SEEDS
    }
    async with served(settings) as (front, _, service):
        sequences = record_sequences(service)
        # text, object and list states: every question asked as its upstream request, whatever the others
        for state in (TEXT_STATE, OBJECT_STATE, LIST_STATE):
            sequences.clear()
            answers = (await ask(front, state, questions))["answers"]
            wanted = {qid: upstream.decide(as_decide(q, state)) for qid, q in questions.items()}
            assert sorted(sequences) == sorted(tuple(ids) for ids, _ in wanted.values())
            for qid in ("restart", "also"):
                assert abs(answers[qid]["noul"] - wanted[qid][1][1]) <= TOL  # P(yes) = P(true)
            for qid in ("next", "bare"):
                assert list(answers[qid]["probabilities"]) == list(questions[qid]["criteria"])
                assert_close(list(answers[qid]["probabilities"].values()), wanted[qid][1])
            assert_close(list(answers["urgency"]["probabilities"].values()), wanted["urgency"][1])
            assert abs(answers["urgency"]["score"] - sum(i * p for i, p in enumerate(wanted["urgency"][1]))) <= TOL
            alone = (await ask(front, state, {"next": questions["next"]}))["answers"]["next"]
            assert_close(list(alone["probabilities"].values()), list(answers["next"]["probabilities"].values()))

        # images, inline where the state places them: upstream's list form, and the envelope's references
        image_state = [
            "Before: ",
            {"image": URIS[3]},
            " after: ",
            {"type": "image_url", "image_url": {"url": URIS[4]}},
            " Done?",
        ]
        for kind in ("noul", "score", "choice"):
            body = {
                "kind": kind,
                "state": image_state,
                "question": "Did the update finish?",
                **({"options": ["yes", "no", "unclear"]} if kind == "choice" else {}),
            }
            sequences.clear()
            answer = await decide(front, body)
            ids, want = upstream.decide(body)
            assert sequences == [tuple(ids)] and ids.count(upstream.model.config.image_token_id) == 8
            assert_close(answer["probabilities"], want)
        text_only = upstream.decide({**body, "state": ["Before: ", " after: ", " Done?"]})[1]
        assert max(abs(a - b) for a, b in zip(want, text_only)) > 1e-4  # the images count
        one_image = {"kind": "noul", "state": {"image": URIS[4]}, "question": "Is it dark?"}
        assert_close(
            (await decide(front, one_image))["probabilities"],
            upstream.decide({**one_image, "state": [{"image": URIS[4]}]})[1],
        )

        envelope_state = ["Earlier: ", "<image:3>", " later: ", {"image": "<image:4>"}, " Done?"]
        upstream_state = ["Earlier: ", {"image": URIS[3]}, " later: ", {"image": URIS[4]}, " Done?"]
        body = {"model": "jev-latest", "state": envelope_state, "questions": questions, "assets": assets}
        response = await front.post("/v1/systemone", json=body)
        answers = (await response.json())["answers"]
        assert response.status == 200, answers
        assert response.headers["x-jev-cache"] == "l1=miss,l2=hit,l3=miss"
        for qid in ("next", "bare"):
            assert_close(
                list(answers[qid]["probabilities"].values()),
                upstream.decide(as_decide(questions[qid], upstream_state))[1],
            )
        assert (
            abs(answers["restart"]["noul"] - upstream.decide(as_decide(questions["restart"], upstream_state))[1][1])
            <= TOL
        )
        assert_close(
            list(answers["urgency"]["probabilities"].values()),
            upstream.decide(as_decide(questions["urgency"], upstream_state))[1],
        )
        # the same image state, another question of a kind already asked: its prefix (images included) is in L3
        other = {"type": "choice", "instructions": "Which is darker?", "criteria": {"first": None, "second": None}}
        response = await front.post("/v1/systemone", json={**body, "questions": {"q": other}})
        assert response.headers["x-jev-cache"] == "l1=miss,l2=hit,l3=hit"
        assert_close(
            list((await response.json())["answers"]["q"]["probabilities"].values()),
            upstream.decide(as_decide(other, upstream_state))[1],
        )

        # the envelope's refusals: what upstream's prompt cannot express
        refused = [
            (
                {"q": {"type": "noul", "instructions": "Open?", "criteria": {"true": "it is open"}}},
                "criteria.true/false",
            ),
            ({"q": {"type": "score", "criteria": ["low", "mid", "high"]}}, "exactly 6 levels"),
            ({"q": {"type": "set", "criteria": {"a": None, "b": None}}}, "unsupported_question_type"),
            ({"q": {"type": "span", "criteria": ["Dialog", "Update"]}}, "unsupported_question_type"),
        ]
        for qs, says in refused:
            assert says in json.dumps(await ask(front, TEXT_STATE, qs, status=422))
        response = await front.post(
            "/v1/systemone", json={"model": "jev-latest", "state": ["x", {"image": URIS[3]}], "questions": questions}
        )
        assert response.status == 422 and "name it in `assets`" in await response.text()


async def test_lm_head_rows_defaults_and_the_length_limit(worker_settings, jev_dir, tmp_path):
    """Without label_head.safetensors the LM head's rows serve (in FP32), without calibration.json every
    temperature is 1.0 (setup()'s default); a prompt over max_length tokens is refused as processing.rs does."""
    from ..family_helpers import copy_without

    folder = copy_without(jev_dir, tmp_path, "label_head.safetensors", "calibration.json")
    reference = Upstream(folder)
    assert reference.rows is None and reference.temps == {"noul": 1.0, "score": 1.0, "choice": 1.0}
    long_state = " ".join([TEXT_STATE] * 4)  # longer than the warmup's prompts, which must fit too
    body = {"kind": "choice", "state": long_state, "question": "What next?", "options": ["Restart now", "Later"]}
    ids, want = reference.decide(body)
    settings = worker_settings(recipe=jev_recipe(max_length=len(ids)), model_path=str(folder))
    async with served(settings) as (front, worker, _):
        assert_close((await decide(front, body))["probabilities"], want)  # exactly max_length tokens: served
        noul = {"kind": "noul", "state": long_state, "question": "Restart?"}
        assert_close((await decide(front, noul))["probabilities"], reference.decide(noul)[1])
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["head"] == "lm_head" and serving["calibration"]["source"] is None
        longer = {**body, "question": "What next, then?"}
        t = len(reference.decide(longer)[0])
        assert t > len(ids)
        answer = await decide(front, longer, status=422)
        assert too_long(len(ids), t) in json.dumps(answer)


def test_what_the_family_refuses_at_load(jev_dir, tmp_path):
    """Upstream's checks of its files and labels, and no recipe prompt or verbalizer of our own."""
    from jev_worker.families.jev_vl.contract import DecisionFiles
    from jev_worker.families.jev_vl.layout import JevVlBuilder
    from tools.tiny_jev_vl_checkpoint import decision_head

    readout = build_readout("jev-vl", {})
    tokenizer = AutoTokenizer.from_pretrained(jev_dir)
    recipe = jev_recipe()
    with pytest.raises(ServingError, match="remove the recipe's prompt"):
        readout.prompt_builder(
            tokenizer,
            recipe.model_copy(
                update={"prompt": recipe.prompt.model_copy(update={"system": "You are a decision model."})}
            ),
            "id",
        )
    builder = readout.prompt_builder(tokenizer, recipe, "id")
    assert isinstance(builder, JevVlBuilder) and len(builder.labels) == 256
    for n in (1, 257):
        with pytest.raises(TooManyOptions, match=f"choice needs 2-256 options, got {n}"):
            builder.coded(n)
    readout.check(str(jev_dir))
    with pytest.raises(ServingError, match="decision_head.json"):
        readout.check(str(copy_without_head(jev_dir, tmp_path / "a")))
    head = decision_head(tokenizer)
    for change, says in (
        ({"slots": {"ranges": {"noul": [0, 2], "choice": [2, 18]}}}, "slots.ranges"),
        ({"bias": head["bias"][:23]}, "24 numbers"),
        ({"verbalizer_ids": head["verbalizer_ids"][:23]}, "24 token ids"),
    ):
        folder = copy_without_head(jev_dir, tmp_path / says.replace(" ", "-"))
        (folder / "adapter_vllm" / "decision_head.json").write_text(json.dumps({**head, **change}))
        with pytest.raises(ServingError, match=says):
            DecisionFiles.read(str(folder))
    folder = copy_without_head(jev_dir, tmp_path / "calibration")
    (folder / "adapter_vllm" / "decision_head.json").write_text(json.dumps(head))
    (folder / "calibration.json").write_text(json.dumps({"per_kind": {"noul": 1.2, "choice": 0.0}}))
    with pytest.raises(ServingError, match="per_kind.choice"):
        DecisionFiles.read(str(folder))
    (folder / "calibration.json").write_text(json.dumps({"per_kind": {"noul": 1.2, "choice": 0.9}}))
    assert DecisionFiles.read(str(folder)).temperatures == {"noul": 1.2, "score": 1.0, "choice": 0.9}
    with pytest.raises(InvalidRequest):
        from jev_common.schema import DecisionRequest
        from jev_worker.families.jev_vl.readout import JevVlForm

        JevVlForm().job(
            DecisionRequest.model_validate(
                {"kind": "noul", "state": ["x", {"image": "https://x/y.png"}], "question": "q?"}
            ),
            lambda uri: "key",
        )


def copy_without_head(folder: Path, out: Path) -> Path:
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("decision_head.json", "*.safetensors"))
    return out


async def test_export_merges_the_adapter_into_fp32_label_rows(worker_settings, jev_dir, tmp_path):
    """recipes/jev-27b-vl/export.py on the source snapshot's layout (adapter_vllm/ LoRA with lm_head,
    decision_head.json, calibration.json): label_head.safetensors holds export_merged.py's rows
    (lm_head[ids].float() + scale * (B[ids] @ A)) for the verbalizer ids and every option label; the
    decision files are carried; the export serves as upstream's formula over those rows."""
    from tools.tiny_jev_vl_checkpoint import add_lora

    snapshot = tmp_path / "snapshot"
    shutil.copytree(jev_dir, snapshot, ignore=shutil.ignore_patterns("label_head.safetensors"))
    add_lora(snapshot)
    out = tmp_path / "export"
    spec = importlib.util.spec_from_file_location("jev_export", REPO_ROOT / "recipes" / "jev-27b-vl" / "export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--base", str(snapshot), "--out", str(out), "--dtype", "float32"]) == 0

    head = json.loads((snapshot / "adapter_vllm" / "decision_head.json").read_text())
    labels = single_token_labels(AutoTokenizer.from_pretrained(snapshot), "x\n{}) y")
    head_ids = list(dict.fromkeys(head["verbalizer_ids"] + [t for _, t in labels]))
    config = json.loads((snapshot / "adapter_vllm" / "adapter_config.json").read_text())
    lora = load_file(str(snapshot / "adapter_vllm" / "adapter_model.safetensors"))
    lm_head = load_file(str(snapshot / "model.safetensors"))["lm_head.weight"]
    a, b = lora["base_model.model.lm_head.lora_A.weight"], lora["base_model.model.lm_head.lora_B.weight"]
    idx = torch.tensor(head_ids)
    rows = lm_head[idx].float() + config["lora_alpha"] / config["r"] * (b[idx] @ a)
    exported = load_file(str(out / "label_head.safetensors"))
    assert exported["ids"].dtype == torch.int64 and exported["ids"].tolist() == head_ids
    assert exported["rows"].dtype == torch.float32 and torch.allclose(exported["rows"], rows, atol=1e-6)
    for name in ("calibration.json", "adapter_vllm/decision_head.json"):
        assert (out / name).read_bytes() == (snapshot / name).read_bytes()
    from tools.export_checkpoint import verify_manifest

    assert verify_manifest(out) == []

    reference = Upstream(out)
    body = {
        "kind": "choice",
        "state": LIST_STATE,
        "question": "What next?",
        "options": ["Restart now", "Later", "Close"],
    }
    async with served(worker_settings(recipe=jev_recipe(), model_path=str(out))) as (front, _, _):
        assert_close((await decide(front, body))["probabilities"], reference.decide(body)[1])
