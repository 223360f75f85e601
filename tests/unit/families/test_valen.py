"""valen-head on valen-lora (Valen-Preview-0923) on a tiny checkpoint in Valen's layout (checkpoint.pt +
config.json over a Qwen3.5 base): every choice, noul and score answer equal to a plain reference written out
here from Liuziyu77/Valen @06251f9d9d3c06ea690be93b8696ccc66471f8c9:
- `valen/data/compilers/qwen.py` `Compiler.compile`: the state's chat template without a generation prompt, then
  each segment tokenised on its own: "<|im_start|>user\n", "Task: {type}\nQuestion: {instructions}\nCandidates:\n",
  per candidate "{key}: {description}" (score: the description alone) then "\n", and "Decision:" (copied out
  literally in `Reference.compile`);
- `valen/data/schema.py` `candidates`: noul's two candidates ("True / 是：满足问题中的条件。", "False / 否：不满足问题
  中的条件。", literally), choices of 1 to 255 criteria, score levels in order;
- `ValenQwen.forward` / `DecisionHead` and `inference.answer`, with the LoRA run unmerged as PEFT runs it."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from torch import nn
from transformers import Qwen3_5ForConditionalGeneration

from jev_common.checkpoint_files import ServingError
from jev_common.recipe import load_recipe
from jev_common.vl import load_vl_processor
from jev_worker.serving import build_serving, preflight

from ..family_helpers import TOL, ask, assert_probs, copy_without, run_worker, served
from ..vl_helpers import pattern_image, png_uri, request_line

STATE = "The kettle is whistling and steam comes out of its spout."


class NeedsCode:
    """Pickled into a checkpoint.pt that weights_only loading must refuse."""


@pytest.fixture(scope="module")
def tiny_valen(tmp_path_factory):
    from tools.tiny_valen_checkpoint import make_tiny_valen

    return make_tiny_valen(tmp_path_factory.mktemp("valen"), seed=5)


def valen_recipe(base_dir):
    """The repository's Valen recipe, pointed at the tiny base (readout option base_path), in FP32."""
    recipe = load_recipe("valen-preview-0923")
    model = recipe.model.model_copy(update={"hub_repo": "test/tiny-valen", "revision": "local", "dtype": "float32"})
    serving = recipe.serving.model_copy(update={"options": {"base_path": str(base_dir)}})
    return recipe.model_copy(update={"name": "tiny-valen", "model": model, "serving": serving})


class LoraLinear(nn.Module):
    """PEFT's LoRA forward: base(x) + alpha/r * B(A(x))."""

    def __init__(self, base: nn.Linear, a: torch.Tensor, b: torch.Tensor, scale: float):
        super().__init__()
        self.base, self.a, self.b, self.scale = base, a, b, scale

    def forward(self, x):
        return self.base(x) + self.scale * ((x @ self.a.T) @ self.b.T)


class Reference:
    def __init__(self, valen_dir, base_dir, valen_vision: bool = True):
        payload = torch.load(valen_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
        config = json.loads((valen_dir / "config.json").read_text())
        weights = payload["weights"]
        self.processor = load_vl_processor(base_dir)
        self.tok = self.processor.tokenizer
        self.backbone = Qwen3_5ForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32).model.eval()
        scale = config["lora_alpha"] / config["lora_rank"]
        prefix = "backbone.language_model.base_model.model."
        for key in [k for k in weights if k.startswith(prefix) and ".lora_A." in k]:
            path = key[len(prefix) :].removesuffix(".lora_A.default.weight")
            parent, _, leaf = path.rpartition(".")
            owner = self.backbone.language_model.get_submodule(parent)
            setattr(
                owner,
                leaf,
                LoraLinear(getattr(owner, leaf), weights[key], weights[key.replace(".lora_A.", ".lora_B.")], scale),
            )
        if valen_vision:
            self.backbone.load_state_dict(
                {k[len("backbone.") :]: v for k, v in weights.items() if k.startswith("backbone.visual.")}, strict=False
            )
        self.decision, self.candidate = weights["head.decision.weight"], weights["head.candidate.weight"]
        self.scale = math.sqrt(config["projection_dim"])

    def compile(self, state: str, instructions: str, pairs: list[tuple[str, str]], task: str = "choice"):
        """Valen's Compiler.compile for one branch: (input_ids, candidate positions)."""
        messages = [{"role": "user", "content": [{"type": "text", "text": state}]}]
        base = self.processor.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=False, return_dict=True
        )["input_ids"]
        base = list(base[0]) if isinstance(base[0], list) else list(base)
        suffix = self.tok.encode("<|im_start|>user\n", add_special_tokens=False)
        suffix += self.tok.encode(
            "Task: " + task + "\nQuestion: " + instructions + "\nCandidates:\n", add_special_tokens=False
        )
        positions = []
        for key, description in pairs:
            suffix += self.tok.encode((key + ": " if task != "score" else "") + description, add_special_tokens=False)
            positions.append(len(base) + len(suffix) - 1)
            suffix += self.tok.encode("\n", add_special_tokens=False)
        suffix += self.tok.encode("Decision:", add_special_tokens=False)
        return base + suffix, positions

    @torch.inference_mode()
    def logits(self, state: str, instructions: str, pairs: list[tuple[str, str]], task: str = "choice"):
        ids, positions = self.compile(state, instructions, pairs, task)
        hidden = self.backbone(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), use_cache=False
        ).last_hidden_state
        d = hidden[0, len(ids) - 1].float() @ self.decision.T
        c = hidden[0, positions].float() @ self.candidate.T
        return (c * d).sum(-1) / self.scale, len(ids)

    def probs(self, state: str, instructions: str, pairs: list[tuple[str, str]]) -> tuple[list[float], int]:
        logits, length = self.logits(state, instructions, pairs)
        return torch.softmax(logits / 1.0, -1).tolist(), length


async def test_valen_choice_answers_equal_the_plain_reference(worker_settings, tiny_valen):
    valen_dir, base_dir = tiny_valen
    ref = Reference(valen_dir, base_dir)
    state_object = {"device": "kettle", "sound": "whistling", "note": "très chaud"}
    settings = worker_settings(recipe=valen_recipe(base_dir), model_path=str(valen_dir))
    async with served(settings) as (front, worker, service):
        body = await ask(
            front,
            STATE,
            {
                "what": {
                    "type": "choice",
                    "instructions": "What is the kettle doing?",
                    "criteria": {"boiling": "water at 100 C", "cooling": None, "broken": "it leaks"},
                },
                "two": {"type": "choice", "criteria": {"on": None, "off": None}},
            },
        )
        answers = body["answers"]
        names = ["boiling", "cooling", "broken"]
        want, what_len = ref.probs(
            STATE,
            "What is the kettle doing?",
            [("boiling", "water at 100 C"), ("cooling", "cooling"), ("broken", "it leaks")],
        )
        assert_probs(answers["what"]["probabilities"], want, names)
        assert max(want) - min(want) > 1e-3  # the random head tells the options apart
        assert answers["what"]["choice"] == names[max(range(3), key=want.__getitem__)]
        k = len(want)
        assert abs(answers["what"]["confidence"] - max(0.0, (max(want) - 1 / k) / (1 - 1 / k))) <= TOL
        want, two_len = ref.probs(STATE, "Which option fits the state best?", [("on", "on"), ("off", "off")])
        assert_probs(answers["two"]["probabilities"], want, ["on", "off"])
        # input tokens as Valen counts them: the state once, then each question's suffix
        assert body["usage"]["input_tokens"] == what_len + two_len - _state_tokens(ref, STATE)

        body = await ask(
            front,
            state_object,
            {"q": {"type": "choice", "instructions": "Hot?", "criteria": {"yes": "very", "no": "not at all"}}},
        )
        want, _ = ref.probs(
            json.dumps(state_object, ensure_ascii=False), "Hot?", [("yes", "very"), ("no", "not at all")]
        )
        assert_probs(body["answers"]["q"]["probabilities"], want, ["yes", "no"])

        visual = service.model.loaded.model.model.visual
        payload = torch.load(valen_dir / "checkpoint.pt", weights_only=True)["weights"]
        assert torch.equal(visual.merger.linear_fc1.weight, payload["backbone.visual.merger.linear_fc1.weight"])
        assert torch.equal(visual.blocks[4].attn.qkv.weight, payload["backbone.visual.blocks.4.attn.qkv.weight"])
        health = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert health["backend"] == "valen-lora" and health["readout"] == "valen-head"
        assert health["stage"] == "vision_top" and health["calibration"]["temperature"] == 1.0
        stats = await (await worker.get("/v1/cache/stats")).json()
        assert "runs whole" in stats["prefix_reuse"]


def _state_tokens(ref: Reference, state: str) -> int:
    messages = [{"role": "user", "content": [{"type": "text", "text": state}]}]
    text = ref.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return len(ref.tok(text, add_special_tokens=False)["input_ids"])


async def test_valen_noul_and_score_follow_its_compiler(worker_settings, tiny_valen):
    """noul: one branch over Valen's fixed true/false candidates, P(true); score: one branch per level, each
    with its description alone, the levels' logits in one softmax (valen/data/schema.py, compilers/qwen.py,
    evaluation/inference.py `answer`)."""
    valen_dir, base_dir = tiny_valen
    ref = Reference(valen_dir, base_dir)
    levels = ["cold", "warm", "boiling hot"]
    async with served(worker_settings(recipe=valen_recipe(base_dir), model_path=str(valen_dir))) as (front, _, _):
        body = await ask(
            front,
            STATE,
            {
                "hot": {"type": "noul", "instructions": "Is the water hot?", "criteria": {"true": "ignored by Valen"}},
                "how": {"type": "score", "instructions": "How hot is the water?", "criteria": levels},
            },
        )
        answers = body["answers"]
        logits, noul_len = ref.logits(
            STATE,
            "Is the water hot?",
            [("true", "True / 是：满足问题中的条件。"), ("false", "False / 否：不满足问题中的条件。")],
            "noul",
        )
        want = torch.softmax(logits, -1).tolist()[0]
        assert abs(answers["hot"]["noul"] - want) <= TOL and abs(want - 0.5) > 1e-4

        branches = [
            ref.logits(STATE, "How hot is the water?", [(str(i), level)], "score") for i, level in enumerate(levels)
        ]
        probs = torch.softmax(torch.cat([b[0] for b in branches]), -1).tolist()
        assert_probs(answers["how"]["probabilities"], probs, ["0", "1", "2"])
        assert max(probs) - min(probs) > 1e-3
        assert abs(answers["how"]["score"] - sum(i * p for i, p in enumerate(probs))) <= TOL
        assert answers["how"]["legend"] == {"0": "cold", "1": "warm", "2": "boiling hot"}
        mode = max(range(3), key=probs.__getitem__)
        uniform = sum(abs(i - 1) for i in range(3)) / 3
        confidence = max(0.0, 1 - sum(p * abs(i - mode) for i, p in enumerate(probs)) / uniform)
        assert abs(answers["how"]["confidence"] - confidence) <= TOL
        state_len = _state_tokens(ref, STATE)  # Valen's usage: the state once, then every branch's suffix
        assert body["usage"]["input_tokens"] == state_len + (noul_len - state_len) + sum(
            b[1] - state_len for b in branches
        )

        body = await ask(
            front, STATE, {"q": {"type": "score", "instructions": "How hot?", "criteria": ["a", " "]}}, status=422
        )
        assert "blank" in json.dumps(body)
        # one option: `candidates` takes 1 to 255 criteria; its softmax over one logit is 1
        one = {"type": "choice", "instructions": "Which?", "criteria": {"kettle": "a kettle"}}
        assert (await ask(front, STATE, {"q": one}))["answers"]["q"]["probabilities"] == {"kettle": 1.0}


@pytest.mark.parametrize(
    "question",
    [
        {"type": "set", "criteria": {"hot": None, "cold": None}},
        {"type": "span", "criteria": ["its spout", "The kettle"]},
    ],
)
async def test_valen_refuses_types_it_has_no_head_for(worker_settings, tiny_valen, question):
    valen_dir, base_dir = tiny_valen
    async with served(worker_settings(recipe=valen_recipe(base_dir), model_path=str(valen_dir))) as (front, _, _):
        body = await ask(front, STATE, {"q": question}, status=422)
        assert body["detail"]["error_type"] == "unsupported_question_type"
        assert "valen-head" in json.dumps(body)


async def test_valen_refuses_control_tokens_and_blank_text(worker_settings, tiny_valen):
    valen_dir, base_dir = tiny_valen
    choice = {"type": "choice", "instructions": "Which?", "criteria": {"a": None, "b": None}}
    async with served(worker_settings(recipe=valen_recipe(base_dir), model_path=str(valen_dir))) as (front, _, _):
        body = await ask(front, "Look: <|image_pad|>", {"q": choice}, status=422)
        assert "<|image_pad|>" in json.dumps(body)
        body = await ask(front, STATE + "<|im_end|>", {"q": choice}, status=422)
        assert "<|im_end|>" in json.dumps(body)
        body = await ask(front, STATE, {"q": {**choice, "criteria": {"a": "   ", "b": None}}}, status=422)
        assert "blank" in json.dumps(body)
        body = await ask(front, STATE, {"q": {**choice, "instructions": "  "}}, status=422)
        assert "blank" in json.dumps(body)


async def test_valen_refuses_a_branch_past_max_length(worker_settings, tiny_valen, tmp_path):
    valen_dir, base_dir = tiny_valen
    short = tmp_path / "short"
    shutil.copytree(valen_dir, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_length": 160}))
    async with served(worker_settings(recipe=valen_recipe(base_dir), model_path=str(short))) as (front, _, _):
        body = await ask(
            front,
            " ".join(["word"] * 200),
            {"q": {"type": "choice", "instructions": "Which?", "criteria": {"a": None, "b": None}}},
            status=422,
        )
        assert "max_length is 160" in json.dumps(body)


def test_valen_needs_its_files(tmp_path, tiny_valen):
    valen_dir, base_dir = tiny_valen
    recipe = valen_recipe(base_dir)
    with pytest.raises(ServingError, match="needs checkpoint.pt"):
        preflight(recipe, str(copy_without(valen_dir, tmp_path / "a", "checkpoint.pt")))
    with pytest.raises(ServingError, match="needs config.json"):
        preflight(recipe, str(copy_without(valen_dir, tmp_path / "b", "config.json")))

    payload = torch.load(valen_dir / "checkpoint.pt", weights_only=True)
    no_head = copy_without(valen_dir, tmp_path / "c")
    torch.save(
        {**payload, "weights": {k: v for k, v in payload["weights"].items() if k != "head.candidate.weight"}},
        no_head / "checkpoint.pt",
    )
    with pytest.raises(ServingError, match="no tensor 'head.candidate.weight'"):
        preflight(recipe, str(no_head))

    code = copy_without(valen_dir, tmp_path / "d")
    torch.save({**payload, "training_state": NeedsCode()}, code / "checkpoint.pt")
    with pytest.raises(
        ServingError, match=r"checkpoint.pt is not a plain tensor state \(torch.load\(weights_only=True\)"
    ):
        preflight(recipe, str(code))
    done = run_worker(tmp_path / "d", recipe, code)
    assert done.returncode == 2, done.stderr
    assert "checkpoint.pt is not a plain tensor state" in done.stderr

    assert build_serving(recipe, str(valen_dir)).backend.name == "valen-lora"  # the family's own backend


def test_valen_base_must_be_the_one_it_was_trained_on(tmp_path, tiny_valen):
    from jev_worker.families.valen.backend import load_valen

    valen_dir, base_dir = tiny_valen
    other = tmp_path / "base"
    shutil.copytree(base_dir, other)
    with open(other / "model.safetensors", "ab") as handle:
        handle.write(b" ")
    recipe = valen_recipe(other)
    with pytest.raises(ServingError, match="model.safetensors has sha256 .* but checkpoint.pt was trained on"):
        load_valen(recipe, str(valen_dir), "cpu", "float32")


@torch.inference_mode()
def image_reference(
    ref: Reference, image, before: str, after: str, instructions: str, pairs: list[tuple[str, str]]
) -> list[float]:
    """Valen's compiler on a `messages` state [text, image, text]: the processor renders and expands the image,
    the backbone runs its vision tower (Valen's trained blocks and merger when the reference loaded them) on
    the pixels, then the choice branch and the head."""
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": before}, {"type": "image"}, {"type": "text", "text": after}],
        }
    ]
    text = ref.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    base = ref.processor(text=[text], images=[image], return_tensors="pt")
    state_ids = base["input_ids"][0].tolist()
    suffix = ref.tok.encode("<|im_start|>user\n", add_special_tokens=False)
    suffix += ref.tok.encode("Task: choice\nQuestion: " + instructions + "\nCandidates:\n", add_special_tokens=False)
    positions = []
    for key, description in pairs:
        suffix += ref.tok.encode(key + ": " + description, add_special_tokens=False)
        positions.append(len(state_ids) + len(suffix) - 1)
        suffix += ref.tok.encode("\n", add_special_tokens=False)
    suffix += ref.tok.encode("Decision:", add_special_tokens=False)
    ids = torch.tensor([state_ids + suffix])
    extra = {}
    if "mm_token_type_ids" in base:
        extra["mm_token_type_ids"] = torch.cat(
            [base["mm_token_type_ids"], torch.zeros(1, len(suffix), dtype=torch.long)], 1
        )
    hidden = ref.backbone(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=base["pixel_values"],
        image_grid_thw=base["image_grid_thw"],
        use_cache=False,
        **extra,
    ).last_hidden_state
    d = hidden[0, -1].float() @ ref.decision.T
    c = hidden[0, positions].float() @ ref.candidate.T
    return torch.softmax((c * d).sum(-1) / ref.scale, -1).tolist()


async def test_valen_image_states_are_embedded_with_its_trained_vision_weights(worker_settings, tiny_valen, tmp_path):
    """The preencoder, on the Valen recipe, writes its base's vision tower with Valen's trained blocks and merger;
    the worker places the image where the state names it, as Valen's compiler places an image item; the answer
    equals Valen's own forward on the pixels, and differs from one made with the stock base's vision tower."""
    import yaml

    from jev_preencoder.encode import Encoder
    from jev_preencoder.settings import PreencoderSettings

    valen_dir, base_dir = tiny_valen
    recipe = valen_recipe(base_dir)
    recipe_dir = tmp_path / "recipe"
    recipe_dir.mkdir()
    (recipe_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
    encoder = Encoder(
        PreencoderSettings(
            recipe=str(recipe_dir), model_path=str(valen_dir), device="cpu", dtype="float32", redis_url="none"
        )
    )
    payload = torch.load(valen_dir / "checkpoint.pt", weights_only=True)["weights"]
    assert torch.equal(
        encoder.model.model.visual.merger.linear_fc1.weight, payload["backbone.visual.merger.linear_fc1.weight"]
    )
    seed, size = 7, (64, 64)
    assets = tmp_path / "assets"
    summary = await encoder.encode_lines([request_line(png_uri(seed, size))], str(assets), None)
    assert summary.done == 1, summary.results

    ref = Reference(valen_dir, base_dir)
    stock = Reference(valen_dir, base_dir, valen_vision=False)
    pairs = [("kettle", "a kettle on a stove"), ("cat", "a sleeping cat"), ("car", "a red car")]
    question = {"type": "choice", "instructions": "What is in the picture?", "criteria": dict(pairs)}
    image = pattern_image(seed, size)
    asset = {"type": "image", "format": "png", "data_base64": png_uri(seed, size).split(",", 1)[1]}
    settings = worker_settings(recipe=recipe, model_path=str(valen_dir), asset_dir=str(assets))
    async with served(settings) as (front, _, _):
        response = await front.post(
            "/v1/systemone",
            json={
                "model": "jev-latest",
                "state": "Look: <image:photo> Which is it?",
                "questions": {"q": question},
                "assets": {"<image:photo>": asset},
            },
        )
        body = await response.json()
        assert response.status == 200, body
        want = image_reference(ref, image, "Look: ", " Which is it?", "What is in the picture?", pairs)
        assert_probs(body["answers"]["q"]["probabilities"], want, [k for k, _ in pairs])
        stock_want = image_reference(stock, image, "Look: ", " Which is it?", "What is in the picture?", pairs)
        assert max(abs(a - b) for a, b in zip(want, stock_want)) > 1e-4  # Valen's vision weights matter here
