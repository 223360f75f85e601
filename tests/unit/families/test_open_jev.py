"""open-jev (Open-Jev 9B, 27B v1.1) on a tiny release in Open-Jev's published layout (tools/tiny_open_jev_checkpoint.py:
a Qwen3.5 base whose chat template renders the thinking block as Qwen3.5's does, and `package/checkpoint/` with
`model.json`, `head.pt`, `temperature.json` and a PEFT `adapter/`), exported by the recipe's own export.py.

Upstream, written out here, never through the worker's builder:
- the golden cases of ThinkFlowLab/system1-omni `tests/open_jev/data/contract.json` @
  79e2ddf1d40a0ab4be5e2424679be39e0792f5d6 ("generated from Open-Jev @ 3308a15"), copied unchanged (whitespace
  aside) to data/open_jev_contract.json: each request, its candidate prompts (the user message of each candidate),
  head logits, temperature and the response Open-Jev answers;
- the scoring of Zefan-Cai/Open-Jev `jev/model.py` / `jev/serving.py` (b9e6bdc5c84f71e1059971b61a0310c2b0db79e7)
  and system1-omni `recipe/open_jev/export_merged.py` (307380eef58133851c614f0a5e0f7dc20041c070): each candidate
  `apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
  enable_thinking=False)`, tokenised with the tokenizer's defaults, the base's `model.language_model` with the LoRA
  (`lora_alpha / r * B @ A`), the last token's final hidden state (FP32) @ head weight + bias, then
  `exp((v - max) / T) / sum` in float64 over a question's candidates; noul logits are [0, s].
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoTokenizer

from jev_common.checkpoint_files import ServingError
from jev_common.schema import SystemOneRequest

from ..family_helpers import TOL, ask, ask_twice, served, served_ids, tiny_recipe_of

CASES = json.loads((Path(__file__).parent / "data" / "open_jev_contract.json").read_text(encoding="utf-8"))
THINKING_OFF = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from tools.tiny_open_jev_checkpoint import export_open_jev, make_tiny_open_jev_release

    folder = tmp_path_factory.mktemp("open-jev")
    base, repo = make_tiny_open_jev_release(folder, seed=5)
    return base, repo, export_open_jev("open-jev-9b", base, repo, folder / "export")


def open_jev_recipe(**prompt):
    return tiny_recipe_of("open-jev-9b", **prompt)


class Reference:
    """Open-Jev's scoring of candidate prompts (module docstring), on the release's own files."""

    def __init__(self, base: Path, repo: Path):
        checkpoint = repo / "package" / "checkpoint"
        self.tokenizer = AutoTokenizer.from_pretrained(base)
        full = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
        self.backbone = full.model.language_model.eval()
        config = json.loads((checkpoint / "adapter" / "adapter_config.json").read_text())
        scale = config["lora_alpha"] / config["r"]
        lora = load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))
        params = dict(self.backbone.named_parameters())
        with torch.no_grad():
            for key, a in lora.items():
                if key.endswith(".lora_A.weight"):
                    module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                    params[f"{module}.weight"] += scale * lora[key.replace("lora_A", "lora_B")] @ a
        head = torch.load(checkpoint / "head.pt", weights_only=True)
        self.weight, self.bias = head["weight"].float(), head["bias"].float()
        self.temperature = json.loads((checkpoint / "temperature.json").read_text())["temperature"]

    def ids(self, prompt: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        assert text.endswith(THINKING_OFF)
        return self.tokenizer(text, truncation=False)["input_ids"]

    @torch.inference_mode()
    def scalar(self, prompt: str) -> float:
        ids = torch.tensor([self.ids(prompt)])
        hidden = self.backbone(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state
        return float((hidden[0, -1].float() @ self.weight.T + self.bias).reshape(-1)[0])

    def probabilities(self, prompts: list[str], kind: str) -> list[float]:
        scores = [self.scalar(p) for p in prompts]
        return probabilities(scores, kind, self.temperature)


def probabilities(scores: list[float], kind: str, temperature: float) -> list[float]:
    logits = [0.0, scores[0]] if kind == "noul" else scores
    top = max(logits)
    exp = [math.exp((v - top) / temperature) for v in logits]
    return [e / sum(exp) for e in exp]


def answer(kind: str, keys: list[str], p: list[float], legend=None) -> dict:
    """Open-Jev's `format_answers` for one question."""
    if kind == "noul":
        return {"type": "noul", "noul": p[1]}
    mode, n = max(range(len(p)), key=p.__getitem__), len(p)
    if kind == "choice":
        return {
            "type": "choice",
            "choice": keys[mode],
            "probabilities": dict(zip(keys, p)),
            "confidence": 1.0 if n == 1 else (p[mode] - 1 / n) / (1 - 1 / n),
        }
    spread = sum(abs(i - mode) * v for i, v in enumerate(p))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return {
        "type": "score",
        "score": sum(i * v for i, v in enumerate(p)),
        "probabilities": dict(zip(keys, p)),
        "confidence": max(0.0, 1 - spread / uniform),
        "legend": legend,
    }


def assert_close(got, want, tol: float = TOL) -> None:
    """Numbers within `tol`; mappings with the same keys (probabilities in the same order), the rest equal."""
    if isinstance(want, float):
        assert abs(got - want) <= tol, (got, want)
    elif isinstance(want, dict):
        assert sorted(got) == sorted(want), (got, want)
        if "probabilities" in want:
            assert list(got["probabilities"]) == list(want["probabilities"])
        for key in want:
            assert_close(got[key], want[key], tol)
    else:
        assert got == want, (got, want)


def answerable(case: dict) -> tuple[dict, list]:
    """The case's questions (the 1-option choice among them: answered, as upstream answers it), with their golden
    prompts and logits."""
    questions, prompts, logits = {}, [], []
    for (qid, question), rows, row_logits in zip(case["request"]["questions"].items(), case["prompts"], case["logits"]):
        questions[qid] = question
        prompts.append(rows)
        logits.append(row_logits)
    return questions, list(zip(questions, prompts, logits))


@pytest.fixture(scope="module")
def reference(release):
    base, repo, _ = release
    return Reference(base, repo)


async def test_open_jev_serves_the_golden_prompts_ids_and_probabilities(worker_settings, release, reference):
    settings = worker_settings(recipe=open_jev_recipe(), model_path=str(release[2]))
    async with served(settings) as (front, worker, service):
        for case in CASES:
            questions, golden = answerable(case)
            state = case["request"]["state"]
            ids = served_ids(service, state, questions)
            assert ids == [reference.ids(p) for _, prompts, _ in golden for p in prompts]
            assert all(reference.tokenizer.decode(row[-2:]) == "</think>\n\n" for row in ids)  # the head's token
            for body in await ask_twice(front, state, questions):  # the second from L3
                for qid, prompts, _ in golden:
                    question = questions[qid]
                    keys = (
                        list(question["criteria"])
                        if question["type"] == "choice"
                        else [str(i) for i in range(len(question.get("criteria") or []))]
                    )
                    p = reference.probabilities(prompts, question["type"])
                    legend = dict(zip(keys, question["criteria"])) if question["type"] == "score" else None
                    assert_close(body["answers"][qid], answer(question["type"], keys, p, legend))
                    assert len(p) == 1 or max(p) - min(p) > 1e-3  # the tiny head tells the candidates apart
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["readout"] == "scalar-head" and serving["calibration"]["source"] == "temperature.json"
        assert serving["calibration"]["temperatures"]["choice"] == pytest.approx(reference.temperature)
        assert serving["max_length"] == 4096


def test_the_golden_logits_give_the_golden_answers(release):
    """Open-Jev's answers from the fixture's head logits (noul: its two logits are [0, s] shifted by l0), through
    the family's question types and calibration."""
    from jev_worker.families.open_jev.candidates import CandidateChoice, CandidateNoul, CandidateScore
    from jev_worker.readouts.calibration import CalibratedKind, Calibration

    for case in CASES:
        calibration = Calibration.from_config({"temperature": case["temperature"]}, "temperature.json")
        kinds = {k.type: CalibratedKind(k, calibration) for k in (CandidateChoice(), CandidateScore(), CandidateNoul())}
        questions, golden = answerable(case)
        request = SystemOneRequest.model_validate({"model": "x", "state": "s", "questions": questions})
        for qid, _, row_logits in golden:
            question = request.questions[qid]
            if question.type == "noul":
                row_logits = [row_logits[1] - row_logits[0]]
            got = kinds[question.type].answer(question, [torch.tensor([v]) for v in row_logits], None)
            assert_close(got.model_dump(), case["response"]["answers"][qid], 1e-6)


async def test_a_state_with_spaces_at_its_edges_is_sent_unchanged_and_the_trim_changes_nothing(
    worker_settings, release, reference
):
    """Qwen3.5's template trims the user message; an Open-Jev prompt starts with `Context:` and ends with `No.`,
    so the trim never reaches user text: spaces and newlines at the state's and instructions' edges stay."""
    state = "  \n the kettle whistles \n\n"
    question = {
        "type": "noul",
        "instructions": " Is it hot? \n",
        "criteria": {"true": " yes ", "false": {"b": 1, "a": 2}},
    }
    prompt = (
        f"Context:\n{state}\n\nQuestion:  Is it hot? \n\nYes means:  yes \nNo means: "
        '{"a": 2, "b": 1}\nIs the answer to this question yes? Answer Yes or No.'
    )
    async with served(worker_settings(recipe=open_jev_recipe(), model_path=str(release[2]))) as (front, _, service):
        assert served_ids(service, state, {"q": question}) == [reference.ids(prompt)]
        body = await ask(front, state, {"q": question})
        assert abs(body["answers"]["q"]["noul"] - reference.probabilities([prompt], "noul")[1]) <= TOL


async def test_open_jev_is_position_free_so_every_coherence_mode_answers_unchanged(worker_settings, release):
    """Each candidate its own row, seeing no other option: no option order reaches the answer, so x_coherence
    (cyclic, prior) is answered as off, never refused, and GET /v1/models says position-free."""
    questions = {
        "c": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": None}},
        "s": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "cross", "furious"]},
    }
    async with served(worker_settings(recipe=open_jev_recipe(), model_path=str(release[2]))) as (front, _, _):
        bodies = {}
        for mode in ("off", "cyclic", "prior"):
            response = await front.post(
                "/v1/systemone",
                json={
                    "model": "jev-latest",
                    "state": "I was charged twice.",
                    "questions": questions,
                    "x_coherence": mode,
                },
            )
            assert response.status == 200, await response.text()
            bodies[mode] = await response.json()
        models = (await (await front.get("/v1/models")).json())["models"]
    for mode in ("cyclic", "prior"):
        assert bodies[mode]["answers"] == bodies["off"]["answers"]
        assert bodies[mode]["usage"]["input_tokens"] == bodies["off"]["usage"]["input_tokens"]
    assert models[0]["x_coherence"] == ["cyclic", "off", "prior"]
    assert all(models[0]["x_coherence_types"][t]["position_free"] for t in ("choice", "score"))


async def test_open_jev_refuses_what_upstream_refuses(worker_settings, release):
    long_state = "word " * 4200  # past 4096 tokens per candidate
    refused = [
        ({"q": {"type": "choice", "criteria": {"a": None, "b": None}}}, "needs the question's instructions"),
        ({"q": {"type": "noul", "instructions": "Hot?", "criteria": {"true": "it is"}}}, "both a true and a false"),
    ]
    async with served(worker_settings(recipe=open_jev_recipe(), model_path=str(release[2]))) as (front, worker, _):
        for questions, message in refused:
            body = await ask(front, "Anything", questions, status=422)
            assert message in json.dumps(body), body
        body = await ask(front, long_state, {"q": {"type": "noul", "instructions": "Long?"}}, status=422)
        assert "exceeds max_length=4096; no silent truncation" in json.dumps(body)
        for question in (
            {"type": "set", "criteria": {"hot": None, "cold": None}},
            {"type": "span", "criteria": ["kettle", "Anything"]},
        ):
            body = await ask(front, "Anything kettle", {"q": question}, status=422)
            assert body["detail"]["error_type"] == "unsupported_question_type"
        legacy = await front.post(
            "/v1/systemone",
            json={"kind": "choice", "state": {"text": "x"}, "question": "Which?", "options": ["a", "b"]},
        )
        assert legacy.status == 422 and (await legacy.json())["detail"]["error_type"] == "unsupported_request_form"
        other = await worker.post(
            "/v1/systemone",
            json={"model": "open-jev", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}},
        )
        assert other.status == 400  # upstream's alias `open-jev` is not one of this worker's names (README)


def test_a_recipe_prompt_section_is_refused(release):
    from jev_worker.families.open_jev.layout import OpenJevBuilder

    tokenizer = AutoTokenizer.from_pretrained(release[2])
    with pytest.raises(ServingError, match="remove prompt.state_block"):
        OpenJevBuilder(tokenizer, open_jev_recipe(state_block="State:\n{state}\n\n"), "x")


def test_the_export_refuses_a_release_missing_a_file_the_family_reads(release, tmp_path):
    import shutil

    from tools.tiny_open_jev_checkpoint import export_open_jev

    base, repo, out = release
    assert {"head.pt", "temperature.json", "model.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "adapter_extras").exists() and not (out / "decision_head.safetensors").exists()
    broken = tmp_path / "repo"
    shutil.copytree(repo, broken, ignore=shutil.ignore_patterns("temperature.json"))
    with pytest.raises(RuntimeError, match="exited 2"):
        export_open_jev("open-jev-9b", base, broken, tmp_path / "out")
