"""vela-heads on the vela-decoder backend (Vela 2.0 0.8B) on a tiny random-weight package in the release's
layout: the state prefix, one isolated block per question, the FP32 candidate head (choice, noul, score,
set) and span head; every answer equal to a plain reference written out here (prompt pieces tokenised one
by one, a plain Qwen3.5 forward over prefix + block, the heads as torch modules); the layout also replays vLLM
Semantic Router's own layout goldens (src/model-runtime/tests/test_vela2_layout.py @ 4d51146a, on its toy fixture)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import nn
from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

from jev_common.checkpoint_files import ServingError
from jev_worker.serving import preflight

from ..family_helpers import TOL, ask, assert_probs, copy_without, family_recipe, run_worker, served

STATE = "Please reset the account of Jane Roe, phone 555-0100, before Friday."
SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def vela_dir(tmp_path_factory):
    from tools.tiny_vela_checkpoint import make_tiny_vela

    return make_tiny_vela(tmp_path_factory.mktemp("vela"), seed=5)


@pytest.fixture
def vela_recipe(tiny_recipe):
    return family_recipe(tiny_recipe, "tiny-vela", family="vela-decoder")


class Reference:
    """The package read with plain torch and tokenizers."""

    def __init__(self, folder):
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "config.json").read_text())
        self.cal = json.loads((folder / "calibration.json").read_text())
        backbone = {k: v for k, v in config["backbone_config"].items() if k not in ("model_type", "architectures")}
        self.model = Qwen3_5TextModel(Qwen3_5TextConfig(**backbone)).eval()
        weights = {**load_file(str(folder / "model-00001-of-00002.safetensors")), **load_file(str(folder / SHARD2))}
        self.model.load_state_dict({k[9:]: v for k, v in weights.items() if k.startswith("backbone.")})
        h, d = config["backbone_config"]["hidden_size"], config["head_dim"]
        self.d = d
        self.cand_norm, self.query_norm = nn.LayerNorm(h), nn.LayerNorm(h)
        self.key, self.query = nn.Linear(h, d, bias=False), nn.Linear(h, d, bias=False)
        self.cand_mlp, self.query_mlp = nn.Linear(h, d), nn.Linear(h, d, bias=False)
        self.scalar = nn.Linear(d, 1, bias=False)
        for module, name in [
            (self.cand_norm, "candidate_norm"),
            (self.query_norm, "query_norm"),
            (self.key, "key"),
            (self.query, "query"),
            (self.cand_mlp, "candidate_mlp"),
            (self.query_mlp, "query_mlp"),
            (self.scalar, "scalar"),
        ]:
            module.load_state_dict({k.split(".")[-1]: v for k, v in weights.items() if k.startswith(f"head.{name}.")})
        self.set_bias = float(weights["set_bias"])
        broad = load_file(str(folder / "broad_head.safetensors"))
        self.wn, self.ln = nn.LayerNorm(h), nn.LayerNorm(h)
        self.slot = nn.Embedding(8, h)
        self.K, self.Q, self.M, self.N = (
            nn.Linear(h, d, bias=False),
            nn.Linear(h, d, bias=False),
            nn.Linear(h, d),
            nn.Linear(h, d, bias=False),
        )
        self.v = nn.Linear(d, 1, bias=False)
        for module, name in [
            (self.wn, "wn"),
            (self.ln, "ln"),
            (self.slot, "slot"),
            (self.K, "K"),
            (self.Q, "Q"),
            (self.M, "M"),
            (self.N, "N"),
            (self.v, "v"),
        ]:
            module.load_state_dict(
                {k.split(".")[-1]: v for k, v in broad.items() if k.startswith(f"span_broad.{name}.")}
            )

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def prefix(self, parts) -> list[int]:
        ids = self.ids("Context:\n")
        for role, text in parts:
            ids += self.ids(f'<segment role="{role}">\n') + self.ids(text) + self.ids("\n</segment>\n")
        return ids

    @torch.inference_mode()
    def hidden(self, block: list[int], parts=(("user", STATE),)) -> torch.Tensor:
        prefix = self.prefix(parts)
        return self.model(input_ids=torch.tensor([prefix + block])).last_hidden_state[0, len(prefix) :].float()

    def block(self, kind: str, question: str, options: list[tuple[str, str]], abstain: bool, target: str = "user"):
        """An options block's ids and each option's last position (the abstain option last)."""
        block = self.ids(f"\n\nTask type: {kind}\nTarget: {target}\nQuestion:\n{question}\nOptions:")
        ends = []
        if abstain:
            options = options + [("[ABS]", "None of the shown options applies.")]
        for key, description in options:
            text = json.dumps({"description": description, "key": key}, separators=(",", ":"))
            block += self.ids(f"\n<option>\n{text}\n</option>")
            ends.append(len(block) - 1)
        suffix = (
            "Select every option supported by the context and instructions."
            if kind == "set"
            else "Select the single option best supported by the context and instructions."
        )
        block += self.ids(f"\n\n{suffix}\nDecision:")
        return block, ends

    @torch.inference_mode()
    def option_logits(
        self,
        kind: str,
        question: str,
        options: list[tuple[str, str]],
        abstain: bool,
        parts=(("user", STATE),),
        target: str = "user",
    ) -> torch.Tensor:
        block, ends = self.block(kind, question, options, abstain, target)
        h = self.hidden(block, parts)
        c, q = self.cand_norm(h[ends]), self.query_norm(h[-1])
        bilinear = (self.key(c) * self.query(q)).sum(-1) / math.sqrt(self.d)
        return bilinear + self.scalar(torch.nn.functional.gelu(self.cand_mlp(c) + self.query_mlp(q))).squeeze(-1)

    @torch.inference_mode()
    def word_probabilities(self, question: str) -> tuple[list[tuple[int, int]], torch.Tensor]:
        """The span block with one label ("answer", ""): words of the repeated state, broad head, sigmoid(/T)."""
        block = self.ids(f"\n\nTask type: span\nTarget: user\nQuestion:\n{question}\nLabels:")
        start = len(block)
        block += self.ids('\n<label>\n{"description":"","key":"answer"}\n</label>')
        end = len(block) - 1
        block += self.ids("\n\nText:\n") + self.ids('<segment role="user">\n')
        encoding = self.tok.encode(STATE, add_special_tokens=False)
        # the state's words (ASCII text: word characters joined by - or _, else one character) and, for each,
        # the first token whose span reaches past the word's start
        words = [m.span() for m in re.finditer(r"\w+(?:[-_]\w+)*|\S", STATE)]
        firsts = [next(i for i, (_, e) in enumerate(encoding.offsets) if e > s) for s, _ in words]
        positions = [len(block) + f for f in firsts]
        block += (
            encoding.ids
            + self.ids("\n</segment>\n")
            + self.ids("\n\nMark every span of the target text that carries one of the labels.\nSpans:")
        )
        h = self.hidden(block)
        word = self.wn(h[positions])
        word = word - word.mean(0, keepdim=True)
        label = self.ln(h[start : end + 1].mean(0, keepdim=True)) + self.slot.weight[:1]  # one label: no centring
        mlp = torch.nn.functional.gelu(self.M(word) + self.N(label))
        logits = (self.K(word) * self.Q(label)).sum(-1) / math.sqrt(self.d) + self.v(mlp).squeeze(-1)
        return words, torch.sigmoid(logits / self.cal["broad_head"]["temperature"])


def softmax(logits: torch.Tensor, temperature: float) -> list[float]:
    return torch.softmax(logits / temperature, -1).tolist()


QUESTIONS = {
    "intent": {
        "type": "choice",
        "instructions": "What does the request ask for?",
        "criteria": {"reset": "an account reset", "refund": None, "other": "anything else"},
    },
    "urgent": {"type": "noul", "instructions": "Is this urgent?", "criteria": {"true": "it has a deadline"}},
    "priority": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
    "topics": {
        "type": "set",
        "instructions": "Which topics does it mention?",
        "criteria": {"account": "user accounts", "billing": None, "phone": "a phone number"},
    },
    "pii": {
        "type": "span",
        "instructions": "Which span is personal information?",
        "criteria": ["Jane Roe", "before Friday", "555-0100"],
    },
}


async def test_vela_answers_equal_the_plain_reference(worker_settings, vela_recipe, vela_dir):
    ref = Reference(vela_dir)
    t = ref.cal["temperature"]
    async with served(worker_settings(recipe=vela_recipe, model_path=str(vela_dir))) as (front, worker, _):
        body = await ask(front, STATE, QUESTIONS)
        answers = body["answers"]

        logits = ref.option_logits(
            "choice",
            "What does the request ask for?",
            [("reset", "an account reset"), ("refund", ""), ("other", "anything else")],
            True,
        )
        want = softmax(logits[:3], t["choice"])
        assert_probs(answers["intent"]["probabilities"], want, ["reset", "refund", "other"])
        assert answers["intent"]["choice"] == ["reset", "refund", "other"][max(range(3), key=want.__getitem__)]
        assert max(want) - min(want) > 1e-3  # random heads must tell the options apart, or this test proves nothing

        logits = ref.option_logits(
            "choice",
            "Is this urgent?",
            [("no", "No. The statement or question is not satisfied."), ("yes", "it has a deadline")],
            True,
        )
        assert abs(answers["urgent"]["noul"] - softmax(logits[:2], t["choice"])[1]) <= TOL

        want = softmax(
            ref.option_logits("score", "How urgent is it?", [("low", ""), ("medium", ""), ("high", "")], False),
            t["score"],
        )
        assert_probs(answers["priority"]["probabilities"], want, ["0", "1", "2"])
        assert abs(answers["priority"]["score"] - sum(i * p for i, p in enumerate(want))) <= TOL

        logits = ref.option_logits(
            "set",
            "Which topics does it mention?",
            [("account", "user accounts"), ("billing", ""), ("phone", "a phone number")],
            False,
        )
        yes = torch.sigmoid((logits + ref.set_bias) / t["set"]).tolist()
        assert_probs(answers["topics"]["probabilities"], yes, ["account", "billing", "phone"])
        threshold = ref.cal["thresholds"]["set:*"]
        assert answers["topics"]["selected"] == [
            n for n, p in zip(["account", "billing", "phone"], yes) if p > threshold
        ]
        assert max(yes) - min(yes) > 1e-3

        words, probs = ref.word_probabilities("Which span is personal information?")
        scores = []
        for candidate in QUESTIONS["pii"]["criteria"]:
            start = STATE.index(candidate)
            inside = [i for i, (a, b) in enumerate(words) if a < start + len(candidate) and b > start]
            scores.append(float(probs[inside].mean()))
        want = [s / sum(scores) for s in scores]
        assert_probs(answers["pii"]["probabilities"], want, QUESTIONS["pii"]["criteria"])
        best = QUESTIONS["pii"]["criteria"][max(range(3), key=want.__getitem__)]
        assert answers["pii"]["span"] == {
            "start": STATE.index(best),
            "end": STATE.index(best) + len(best),
            "text": best,
        }
        assert max(want) - min(want) > 1e-3

        # a question's answer does not depend on the other questions (isolated blocks)
        alone = await ask(front, STATE, {"x": QUESTIONS["intent"]})
        assert_probs(
            alone["answers"]["x"]["probabilities"],
            list(answers["intent"]["probabilities"].values()),
            ["reset", "refund", "other"],
        )

        health = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert health["backend"] == "vela-decoder" and health["readout"] == "vela-heads"
        assert health["calibration"]["temperatures"] == t and health["span_heads"] == ["broad", "router"]
        stats = await (await worker.get("/v1/cache/stats")).json()
        assert "every question block runs whole" in stats["prefix_reuse"]


OBJECT_STATE = {
    "request": "Please reset my account before Friday.",
    "ticket": 4412,
    "channel": {"kind": "email"},
    "answer": "I have reset it.",
}
# the packages' parts for it, written out: user, then context (keys of no known role as `key:` blocks), then answer
OBJECT_PARTS = (
    ("user", "Please reset my account before Friday."),
    ("context", 'ticket:\n4412\n\nchannel:\n{"kind":"email"}'),
    ("answer", "I have reset it."),
)


async def test_vela_object_states_are_read_as_the_packages_typed_parts(worker_settings, vela_recipe, vela_dir):
    ref = Reference(vela_dir)
    t = ref.cal["temperature"]
    target = "user, context, answer"
    questions = {k: QUESTIONS[k] for k in ("intent", "urgent", "priority", "topics")}
    async with served(worker_settings(recipe=vela_recipe, model_path=str(vela_dir))) as (front, _, _):
        answers = (await ask(front, OBJECT_STATE, questions))["answers"]
        logits = ref.option_logits(
            "choice",
            "What does the request ask for?",
            [("reset", "an account reset"), ("refund", ""), ("other", "anything else")],
            True,
            OBJECT_PARTS,
            target,
        )
        assert_probs(answers["intent"]["probabilities"], softmax(logits[:3], t["choice"]), ["reset", "refund", "other"])
        text_state = softmax(
            ref.option_logits(
                "choice",
                "What does the request ask for?",
                [("reset", "an account reset"), ("refund", ""), ("other", "anything else")],
                True,
            )[:3],
            t["choice"],
        )
        assert max(abs(a - b) for a, b in zip(softmax(logits[:3], t["choice"]), text_state)) > 1e-4  # parts matter
        logits = ref.option_logits(
            "choice",
            "Is this urgent?",
            [("no", "No. The statement or question is not satisfied."), ("yes", "it has a deadline")],
            True,
            OBJECT_PARTS,
            target,
        )
        assert abs(answers["urgent"]["noul"] - softmax(logits[:2], t["choice"])[1]) <= TOL
        want = softmax(
            ref.option_logits(
                "score", "How urgent is it?", [("low", ""), ("medium", ""), ("high", "")], False, OBJECT_PARTS, target
            ),
            t["score"],
        )
        assert_probs(answers["priority"]["probabilities"], want, ["0", "1", "2"])
        logits = ref.option_logits(
            "set",
            "Which topics does it mention?",
            [("account", "user accounts"), ("billing", ""), ("phone", "a phone number")],
            False,
            OBJECT_PARTS,
            target,
        )
        assert_probs(
            answers["topics"]["probabilities"],
            torch.sigmoid((logits + ref.set_bias) / t["set"]).tolist(),
            ["account", "billing", "phone"],
        )

        # a string holding a JSON object is that object, as the packages read it
        as_string = (await ask(front, json.dumps(OBJECT_STATE), {"x": QUESTIONS["intent"]}))["answers"]["x"]
        assert_probs(
            as_string["probabilities"], list(answers["intent"]["probabilities"].values()), ["reset", "refund", "other"]
        )
        # a one-key object in the user role is the same single `user` part as the text
        one = (await ask(front, {"request": STATE}, {"x": QUESTIONS["intent"]}))["answers"]["x"]
        assert_probs(one["probabilities"], text_state, ["reset", "refund", "other"])


async def test_vela_applies_the_packages_noul_fit_when_its_calibration_turns_it_on(
    worker_settings, vela_recipe, vela_dir, tmp_path
):
    """calibration.json `noul_calibration` {T, b, default}: with `default: true` every noul answer is
    sigmoid(logit(p) / T + b) (vLLM-SR vela2 `calibration.py` @ 4ac45f7c `Calibration.noul`); the recipe's
    `serving.options.noul_calibration: false` turns it off, as vLLM-SR's model option does."""
    ref = Reference(vela_dir)
    logits = ref.option_logits(
        "choice",
        "Is this urgent?",
        [("no", "No. The statement or question is not satisfied."), ("yes", "it has a deadline")],
        True,
    )
    p = softmax(logits[:2], ref.cal["temperature"]["choice"])[1]
    fit = ref.cal["noul_calibration"]
    fitted = 1 / (1 + math.exp(-(math.log(p / (1 - p)) / fit["T"] + fit["b"])))
    folder = copy_without(vela_dir, tmp_path / "on")
    (folder / "calibration.json").write_text(json.dumps({**ref.cal, "noul_calibration": {**fit, "default": True}}))
    for options, want in (({}, fitted), ({"noul_calibration": False}, p)):
        recipe = vela_recipe.model_copy(update={"serving": vela_recipe.serving.model_copy(update={"options": options})})
        async with served(worker_settings(recipe=recipe, model_path=str(folder))) as (front, worker, _):
            answer = (await ask(front, STATE, {"q": QUESTIONS["urgent"]}))["answers"]["q"]
            assert abs(answer["noul"] - want) <= TOL, (options, answer, want)
            health = (await (await worker.get("/health")).json())["detail"]["serving"]
            assert health["calibration"]["noul_calibration"] == ({"T": 2.0, "b": 0.25} if not options else "off")
    assert abs(fitted - p) > 1e-3


async def test_vela_refuses_what_it_cannot_answer(worker_settings, vela_recipe, vela_dir):
    async with served(worker_settings(recipe=vela_recipe, model_path=str(vela_dir))) as (front, _, _):
        body = await ask(front, OBJECT_STATE, {"q": QUESTIONS["pii"]}, status=422)
        assert "text state" in json.dumps(body)
        span = {"type": "span", "instructions": "When?", "criteria": ["reset my account", "Friday"]}
        body = await ask(front, json.dumps(OBJECT_STATE), {"q": span}, status=422)  # the packages read named parts
        assert "plain text state" in json.dumps(body)
        body = await ask(front, {"request": " ", "ticket": 1}, {"q": QUESTIONS["urgent"]}, status=422)
        assert "user part" in json.dumps(body)
        body = await ask(front, STATE + " <|im_start|>", {"q": QUESTIONS["urgent"]}, status=422)
        assert "control token" in json.dumps(body)


async def test_vela_refuses_a_request_the_package_would_cut(worker_settings, vela_recipe, tmp_path):
    """The packages count every block of a tree against max_length (their `fit`), so a state can be cut even
    when each block alone fits after it; such a request is refused, one the budget holds is answered."""
    from tools.tiny_vela_checkpoint import make_tiny_vela

    ref = Reference(make_tiny_vela(tmp_path / "probe", seed=5))
    blocks = [
        ref.block(
            "choice",
            "What does the request ask for?",
            [("reset", "an account reset"), ("refund", ""), ("other", "anything else")],
            True,
        ),
        ref.block(
            "choice",
            "Is this urgent?",
            [("no", "No. The statement or question is not satisfied."), ("yes", "it has a deadline")],
            True,
        ),
        ref.block("score", "How urgent is it?", [("low", ""), ("medium", ""), ("high", "")], False),
    ]
    overhead = len(ref.ids("Context:\n") + ref.ids('<segment role="user">\n') + ref.ids("\n</segment>\n"))
    need = 3 + 1 + sum(1 + len(ids) + len(ends) for ids, ends in blocks) + len(ref.ids(STATE))
    questions = {k: QUESTIONS[k] for k in ("intent", "urgent", "priority")}
    for max_length, status in ((overhead + need - 1, 422), (overhead + need, 200)):
        folder = make_tiny_vela(tmp_path / str(max_length), seed=5, max_length=max_length)
        assert overhead + len(ref.ids(STATE)) + max(len(ids) for ids, _ in blocks) < max_length  # each block fits
        async with served(worker_settings(recipe=vela_recipe, model_path=str(folder))) as (front, _, _):
            body = await ask(front, STATE, questions, status=status)
            if status == 422:
                assert "cuts the state" in json.dumps(body)
            else:
                assert (await ask(front, STATE, {"q": QUESTIONS["intent"]}))["answers"]["q"]["choice"]


def test_vela_needs_its_files_and_tensors(tmp_path, vela_recipe, vela_dir):
    with pytest.raises(ServingError, match="needs calibration.json"):
        preflight(vela_recipe, str(copy_without(vela_dir, tmp_path / "a", "calibration.json")))
    broken = copy_without(vela_dir, tmp_path / "b")
    heads = load_file(str(broken / SHARD2))
    del heads["span2.v.weight"]
    save_file(heads, str(broken / SHARD2))
    with pytest.raises(ServingError, match="has no 'span2.v.weight'"):
        preflight(vela_recipe, str(broken))
    config = json.loads((vela_dir / "config.json").read_text())
    encoder = copy_without(vela_dir, tmp_path / "c")
    (encoder / "config.json").write_text(json.dumps({**config, "model_type": "vela2-unified"}))
    with pytest.raises(ServingError, match="vela2-unified"):
        preflight(vela_recipe, str(encoder))
    done = run_worker(tmp_path / "w", vela_recipe, copy_without(vela_dir, tmp_path / "w", "tokenizer.json"))
    assert done.returncode == 2, done.stderr
    assert "needs tokenizer.json" in done.stderr


def test_decoder_layout_meets_upstreams_own_goldens():
    """vllm-project/semantic-router src/model-runtime/tests/test_vela2_layout.py @
    4d51146aef3832b75e2a1472af8d8936d26e5a63 `test_decoder_blocks_share_the_parts_and_read_endpoints`, replayed on our
    layout (layout.py) with that test's toy tokenizer (vela_upstream.py): its literal prefix for the state
    {"request": "hello world", "answer": "done"}, a choice block that ends "Decision:" with its option endpoints on the
    closing ">" of its two options and the abstain option, a span block that starts "\\n\\nTask type: span\\nTarget:
    user\\n", holds "\\n\\nText:\\n" and reads its words at "h" and "w" (upstream's span reads the request part of the
    object state; this API's span reads a plain text state, the same single user part)."""
    from jev_worker.families.vela.layout import VelaLayout, state_parts, words_of

    from .vela_upstream import encode

    layout = VelaLayout(lambda text: encode(text).ids)

    def text(ids):
        return "".join(chr(t - 10) for t in ids)

    parts = [(role, encode(part).ids) for role, part in state_parts({"request": "hello world", "answer": "done"})]
    assert text(layout.prefix(parts)) == (
        'Context:\n<segment role="user">\nhello world\n</segment>\n<segment role="answer">\ndone\n</segment>\n'
    )
    choice = layout.options_block("choice", ("user", "answer"), "Q", [("a", "x"), ("b", "y")], abstain=True)
    rendered = text(choice.ids)
    assert rendered.endswith("Decision:")
    assert [rendered[e] for e in choice.ends] == [">"] * 3
    state = encode("hello world")
    span = layout.span_block("user", "x", [("answer", "")], state.ids, words_of("hello world", state.offsets))
    block = text(span.ids)
    assert block.startswith("\n\nTask type: span\nTarget: user\n") and "\n\nText:\n" in block
    assert [block[w] for w in span.words] == ["h", "w"]
