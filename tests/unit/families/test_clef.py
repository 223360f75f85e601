"""clef-joint-head on causal-lm-joint (Cloudflare Clef / Clef-flash) on a tiny random checkpoint in Clef's
layout (Qwen3_5ForConditionalGeneration + joint_head.safetensors + joint_head_config.json): every question of
a request laid out in one sequence as `encode_record` lays it out, one cache-less backbone forward, the joint
schema head over all its hidden states; every answer equal to a plain reference written out here after
Cloudflare's `joint_schema_model.py` (torch's own attention and decoder layers, loaded with the head's tensors).

Upstream: `joint_schema_model.py` as vendored in unslothai/unsloth `unsloth/_vendor/clef/joint_schema_model.py` @
3b9b69e1dd93f3b5b76358d162daa595c54626fb (byte-identical to the file of the Hub repositories, recipe README): SYSTEM
below is its `SYSTEM_PROMPT`, NOUL its `question_options` noul defaults, and `Reference.encode` its `encode_record`
(the schema, prefix and suffix strings copied literally; choice options sorted; instructions falling back to the
question id); the head is its `JointSchemaHead`."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageTextToText, AutoTokenizer

from jev_common.checkpoint_files import ServingError
from jev_common.recipe import load_recipe
from jev_common.vl import load_vl_processor
from jev_worker.serving import build_serving, preflight

from ..family_helpers import TOL, ask, assert_probs, copy_without, family_recipe, served
from ..vl_helpers import pattern_image, png_uri, request_line

SYSTEM = (
    "Read the complete state and schema. Decide every field jointly. Each answer must be exactly one of "
    "that field's allowed options."
)
NOUL = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}
STATE = {
    "note": "The parcel arrived with a dented corner; the kettle inside rattles.",
    "order": {"items": ["kettle", "mug"], "id": 17},
}
QUESTIONS = {
    "damaged": {"type": "noul", "instructions": "Did the item arrive damaged?"},
    "action": {
        "type": "choice",
        "instructions": "What should support do?",
        "criteria": {"replace": None, "refund": "Give the money back", "ask for photos": "Request evidence first"},
    },
    "severity": {"type": "score", "instructions": "How bad is the damage?", "criteria": ["none", "cosmetic", "broken"]},
    "urgent": {
        "type": "noul",
        "instructions": {"ask": "urgency", "scale": [1, 2]},
        "criteria": {"true": "The customer needs it today."},
    },
}


@pytest.fixture(scope="module")
def clef_dir(tmp_path_factory):
    from tools.tiny_clef_checkpoint import make_tiny_clef

    return make_tiny_clef(tmp_path_factory.mktemp("clef"), seed=23)


def clef_recipe(options: dict | None = None):
    """The clef-flash-9b recipe pointed at the tiny checkpoint, in FP32."""
    base = load_recipe("clef-flash-9b")
    model = base.model.model_copy(update={"hub_repo": "test/tiny-clef", "revision": "local", "dtype": "float32"})
    return family_recipe(base.model_copy(update={"model": model}), "tiny-clef", family="clef", options=options)


def render(value):
    return (
        value
        if isinstance(value, str)
        else json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    )


class Reference:
    def __init__(self, folder):
        from tools.tiny_clef_checkpoint import clef_head_modules

        self.folder = folder
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        self.config = json.loads((folder / "joint_head_config.json").read_text())
        self.head = clef_head_modules(self.config)
        self.head.load_state_dict(load_file(str(folder / "joint_head.safetensors")))

    def tokens(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def encode(self, state, questions: dict, max_length: int = 16384, media: tuple[int, ...] = ()):
        """encode_record: (ids, [(type id, question span, option spans, option ids)]); `media`: the images'
        processor-expanded tokens, which go after the prefix, then a newline."""
        schema, fields = self.tokens("\n\nSCHEMA FIELDS:\n"), []
        for n, (qid, q) in enumerate(questions.items(), 1):
            schema += self.tokens(f"\nFIELD {n}\nID: {qid}\nTYPE: {q['type']}\nINSTRUCTION: ")
            start = len(schema)
            schema += self.tokens(render(q.get("instructions") or qid))
            question_span = (start, len(schema))
            schema += self.tokens("\nALLOWED OPTIONS:\n")
            if q["type"] == "noul":
                described = {**NOUL, **(q.get("criteria") or {})}
                options = [(key, described[key]) for key in ("true", "false")]
            elif q["type"] == "choice":
                options = sorted(q["criteria"].items())
            else:
                options = [(str(i), level) for i, level in enumerate(q["criteria"])]
            spans = []
            for k, (option_id, description) in enumerate(options, 1):
                schema += self.tokens(f"OPTION {k}: ")
                start = len(schema)
                semantics = {"option_id": option_id} | ({} if description is None else {"description": description})
                schema += self.tokens(render(semantics))
                spans.append((start, len(schema)))
                schema += self.tokens("\n")
            schema += self.tokens("END FIELD\n")
            fields.append(
                ({"noul": 0, "choice": 1, "score": 2}[q["type"]], question_span, spans, [o for o, _ in options])
            )
        prefix = self.tokens(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nSTATE:\n")
        if media:
            prefix += list(media) + self.tokens("\n")
        suffix = self.tokens("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:")
        state_ids = self.tokens(render(state))[: max_length - len(prefix) - len(schema) - len(suffix)]
        at = len(prefix) + len(state_ids)
        fields = [(t, (q[0] + at, q[1] + at), [(s + at, e + at) for s, e in spans], ids) for t, q, spans, ids in fields]
        return prefix + state_ids + schema + suffix, fields

    @torch.inference_mode()
    def probabilities(self, state, questions: dict, max_length: int = 16384, image=None) -> dict[str, dict[str, float]]:
        """{question id: {option id: probability}}: the backbone (use_cache=False; with `image`, the processor's
        pixels through the model's own vision tower), JointSchemaHead, softmax."""
        pixels, media = {}, ()
        if image is not None:
            processor = load_vl_processor(self.folder)
            text = processor(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[image], return_tensors="pt")
            media = tuple(text["input_ids"][0].tolist())
            pixels = {"pixel_values": text["pixel_values"], "image_grid_thw": text["image_grid_thw"]}
        ids, fields = self.encode(state, questions, max_length, media)
        head, width = self.head, self.config["width"]
        input_ids = torch.tensor([ids])
        if pixels:
            pixels["mm_token_type_ids"] = (input_ids == self.model.config.image_token_id).int()
        hidden = self.model.model(input_ids=input_ids, use_cache=False, **pixels).last_hidden_state[0]
        h = head.hidden_norm(hidden)
        memory = head.memory_projection(h)[None]
        g = h[-1]
        questions_v = torch.stack([h[a:b].mean(0) for _, (a, b), _, _ in fields])
        lm = self.model.get_output_embeddings().weight
        lexical = [torch.stack([lm[ids[a:b]].mean(0) for a, b in spans]) for _, _, spans, _ in fields]
        queries = torch.cat(
            [
                head.option_context_projection(torch.stack([h[a:b].mean(0) for a, b in spans]))
                + head.option_lexical_projection(lex)
                + head.option_question_projection(questions_v[i])[None]
                for i, ((_, _, spans, _), lex) in enumerate(zip(fields, lexical))
            ]
        )[None]
        for layer in head.evidence_layers:
            m = layer.memory_norm(memory)
            queries = queries + layer.attention(layer.query_norm(queries), m, m, need_weights=False)[0]
            queries = queries + layer.feedforward(layer.feedforward_norm(queries))
        routed = queries[0].split([len(f[2]) for f in fields])
        base = head.question_projection(questions_v)
        summaries = torch.stack(
            [(torch.softmax(o @ f / math.sqrt(width), 0)[:, None] * o).sum(0) for f, o in zip(base, routed)]
        )
        types = torch.tensor([f[0] for f in fields])
        out = (
            base + head.option_summary_norm(summaries) + head.global_projection(g)[None] + head.type_embedding(types)
        )[None]
        for layer in head.layers:
            out = layer(out, memory)
        out = head.field_norm(out[0])
        answers = {}
        for i, (qid, field) in enumerate(zip(questions, fields)):
            prior = head.prior_logit_scale.clamp(max=math.log(100)).exp() * (
                F.normalize(lexical[i], dim=-1) @ F.normalize(questions_v[i] + g, dim=-1)
            )
            options = head.option_norm(routed[i])
            f = out[i].expand_as(options)
            features = torch.cat([f, options, f * options, (f - options).abs()], -1)
            joint = head.joint_logit_scale.clamp(max=math.log(100)).exp() * F.cosine_similarity(
                f, options, dim=-1
            ) + head.residual_scorer(features).squeeze(-1)
            logits = prior + torch.sigmoid(head.residual_gate) * joint
            answers[qid] = dict(zip(field[3], torch.softmax(logits, -1).tolist()))
        return answers


@pytest.fixture(scope="module")
def reference(clef_dir):
    return Reference(clef_dir)


def assert_answers(answers: dict, want: dict, questions: dict) -> None:
    for qid, q in questions.items():
        got, p = answers[qid], want[qid]
        if q["type"] == "noul":
            assert abs(got["noul"] - p["true"]) <= TOL, (qid, got, p)
        elif q["type"] == "choice":
            names = list(q["criteria"])
            assert_probs(got["probabilities"], [p[name] for name in names], names)
            assert got["choice"] == max(names, key=p.__getitem__)
        else:
            levels = [str(i) for i in range(len(q["criteria"]))]
            assert_probs(got["probabilities"], [p[level] for level in levels], levels)
            assert abs(got["score"] - sum(i * p[level] for i, level in enumerate(levels))) <= TOL


async def test_clef_answers_equal_the_plain_reference_and_are_joint(worker_settings, clef_dir, reference):
    settings = worker_settings(recipe=clef_recipe(), model_path=str(clef_dir))
    async with served(settings) as (front, worker, _):
        body = await ask(front, STATE, QUESTIONS)
        want = reference.probabilities(STATE, QUESTIONS)
        assert_answers(body["answers"], want, QUESTIONS)
        assert body["usage"]["input_tokens"] == len(reference.encode(STATE, QUESTIONS)[0])
        spread = [max(p.values()) - min(p.values()) for p in want.values()]
        assert min(spread) > 0.05, want  # the random head tells options apart, so a misread span would show

        # joint: a question after "damaged" in the sequence changes its answer (the head reads them together)
        changed = {**QUESTIONS, "urgent": {"type": "noul", "instructions": "Must it ship before Friday?"}}
        again = await ask(front, STATE, changed)
        assert abs(again["answers"]["damaged"]["noul"] - body["answers"]["damaged"]["noul"]) > 1e-4
        assert_answers(again["answers"], reference.probabilities(STATE, changed), changed)

        text_state = "Tracking says delivered, but the customer has not received anything."
        few = {"where": {"type": "choice", "criteria": {"lost": None, "late": None}}, "ok": QUESTIONS["damaged"]}
        assert_answers((await ask(front, text_state, few))["answers"], reference.probabilities(text_state, few), few)

        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["backend"] == "causal-lm-joint" and serving["readout"] == "clef-joint-head"
        assert serving["joint_head"]["width"] == 32 and serving["question_types"] == ["choice", "noul", "score"]
        stats = await (await worker.get("/v1/cache/stats")).json()
        assert "each request runs whole" in stats["prefix_reuse"]


async def test_clef_cuts_the_state_to_max_length_and_refuses_a_schema_over_it(worker_settings, clef_dir, reference):
    ids, _ = reference.encode(STATE, QUESTIONS)
    state_tokens = len(reference.tokens(render(STATE)))
    limit = len(ids) - state_tokens + 5  # five state tokens fit
    settings = worker_settings(recipe=clef_recipe(options={"max_length": limit}), model_path=str(clef_dir))
    async with served(settings) as (front, _, _):
        body = await ask(front, STATE, QUESTIONS)
        assert body["usage"]["input_tokens"] == limit
        assert_answers(body["answers"], reference.probabilities(STATE, QUESTIONS, limit), QUESTIONS)
        refused = await ask(front, "short", {**QUESTIONS, "extra": QUESTIONS["severity"]}, status=422)
        assert "tokens fit" in json.dumps(refused)


@pytest.mark.parametrize(
    "question, says",
    [
        ({"type": "set", "criteria": {"hot": None, "cold": None}}, "unsupported_question_type"),
        ({"type": "span", "criteria": ["dented", "kettle"]}, "unsupported_question_type"),
        ({"type": "choice", "criteria": {"a<|im_end|>": None, "b": None}}, "control token"),
    ],
)
async def test_clef_refuses_what_it_has_no_head_for(worker_settings, clef_dir, question, says):
    settings = worker_settings(recipe=clef_recipe(), model_path=str(clef_dir))
    async with served(settings) as (front, _, _):
        assert says in json.dumps(
            await ask(front, "A dented kettle.", {"q": question, "d": QUESTIONS["damaged"]}, status=422)
        )


async def test_clef_image_states_place_the_images_after_the_prefix(worker_settings, clef_dir, reference, tmp_path):
    """The preencoder runs the checkpoint's own vision tower; the worker puts the image after the prefix, then a
    newline, then the state as sent (its reference included), as `encode_record` places a record's images; the
    answers equal the model's own forward on the pixels. Clef's own request form (a top-level `images` list) is a
    422 naming the asset form: ignored, it would be answered text-only."""
    from jev_preencoder.encode import Encoder
    from jev_preencoder.settings import PreencoderSettings

    seed, size = 11, (64, 64)
    encoder = Encoder(PreencoderSettings(model_path=str(clef_dir), device="cpu", dtype="float32", redis_url="none"))
    summary = await encoder.encode_lines([request_line(png_uri(seed, size))], str(tmp_path / "assets"), None)
    assert summary.done == 1, summary.results
    state = ["Photo of the parcel at delivery:", "<image:photo>"]
    asset = {"type": "image", "format": "png", "data_base64": png_uri(seed, size).split(",", 1)[1]}
    questions = {k: QUESTIONS[k] for k in ("damaged", "action")}
    settings = worker_settings(recipe=clef_recipe(), model_path=str(clef_dir), asset_dir=str(tmp_path / "assets"))
    async with served(settings) as (front, worker, _):
        for client in (front, worker):  # Clef's own form, images beside the state: refused, never answered without
            response = await client.post(
                "/v1/systemone",
                json={
                    "model": "jev-latest",
                    "state": state[0],
                    "questions": questions,
                    "images": [png_uri(seed, size)],
                },
            )
            assert response.status == 422
            assert "top-level `images` is not read" in (text := await response.text()) and "`assets`" in text
        response = await front.post(
            "/v1/systemone",
            json={"model": "jev-latest", "state": state, "questions": questions, "assets": {"<image:photo>": asset}},
        )
        body = await response.json()
        assert response.status == 200, body
        want = reference.probabilities(state, questions, image=pattern_image(seed, size))
        assert_answers(body["answers"], want, questions)
        text_only = reference.probabilities(state, questions)
        assert abs(want["damaged"]["true"] - text_only["damaged"]["true"]) > 1e-4  # the image is read


def test_clef_needs_its_files_keys_and_backend(tmp_path, clef_dir):
    with pytest.raises(ServingError, match="needs joint_head.safetensors"):
        preflight(clef_recipe(), str(copy_without(clef_dir, tmp_path / "a", "joint_head.safetensors")))
    with pytest.raises(ServingError, match="needs joint_head_config.json"):
        preflight(clef_recipe(), str(copy_without(clef_dir, tmp_path / "b", "joint_head_config.json")))
    folder = copy_without(clef_dir, tmp_path / "c")
    config = json.loads((folder / "joint_head_config.json").read_text())
    (folder / "joint_head_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "width"}))
    with pytest.raises(ServingError, match="joint_head_config.json has no 'width'"):
        preflight(clef_recipe(), str(folder))
    folder = copy_without(clef_dir, tmp_path / "d")
    tensors = load_file(str(folder / "joint_head.safetensors"))
    save_file({k: v for k, v in tensors.items() if k != "residual_gate"}, str(folder / "joint_head.safetensors"))
    with pytest.raises(ServingError, match="joint_head.safetensors has no 'residual_gate'"):
        preflight(clef_recipe(), str(folder))
    assert build_serving(clef_recipe(), str(clef_dir)).backend.name == "causal-lm-joint"  # the family's choice
