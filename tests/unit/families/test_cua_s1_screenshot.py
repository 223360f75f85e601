"""cua-s1-screenshot-labels on causal-lm (Cua-S1 4B 0.2, multimodal adapter) on a tiny Qwen3.5 vision-language
checkpoint with a Qwen3.5-shaped chat template (tools/tiny_cua_s1_checkpoint.py: image items, trimmed contents,
the `<think>\\n` generation prompt): every answer equal to Cua-S1's screenshot contract written out here,
independently of the worker's code, after ThinkFlowLab/system1-omni

- `src/models/cua_s1/multimodal/protocol.py` @ 506b4a1a72807c3320fb8139a05a7bb9b197723d (`SYSTEM_PROMPT`,
  `parse_request`, `_text`, `_image`, `build_messages`: the image part first, then the text);
- `src/models/cua_s1/multimodal/model.py` @ 06fe99d6bb2f824859bff722d8dfbb0eb548f884 (`_prepare`:
  `processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` with no enable_thinking,
  then `processor(text=[text], images=[image])`; `score`: a float32 softmax over the letters' logits at the last
  position; `letter_ids`);
- `src/models/cua_s1/native/src/multimodal.rs` @ 04d43d00671ae775ce7b52affe1e9b4e37ef18aa (`chat_image`: the
  rendered prompt as a literal, `<|vision_end|>` directly followed by the text, `<think>\\n` at the end).

The image goes through the preencoder (its asset is what the worker reads); the reference runs the processor on
the same image and a plain forward of the whole prompt.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForImageTextToText

from jev_common.recipe import load_recipe
from jev_common.vl import load_vl_processor

from ..family_helpers import assert_probs, served
from ..vl_helpers import pattern_image

SYSTEM_PROMPT = (
    "You are a one-pass computer-use decision model. You are shown the "
    "current state of a screen and a fixed, closed list of candidate "
    "(element, action) options, each given a single letter. Choose exactly "
    "one option: the single best next action to take. Answer with ONLY that "
    "option's letter -- no words, no punctuation, no explanation."
)
SIZE = (64, 48)
KEEP = {
    "type": "choice",
    "instructions": "Keep the files.",
    "criteria": {"delete": 'Click "Delete"', "cancel": None, "close": {"element": "window", "action": "close"}},
}
ANY = {"type": "choice", "instructions": None, "criteria": {"Click Delete": None, "Click Cancel": "the blue one"}}
ROUTE = {
    "type": "choice",
    "instructions": ["open", "the", {"menu": "Fichier"}],
    "criteria": {f"o{i}": f"option {i}" for i in range(26)},
}


def text_of(value) -> str:
    """protocol._text: a string as is, an object or array as json.dumps(ensure_ascii=False) writes it."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, allow_nan=False)


def user_text(question: dict) -> str:
    """protocol.build_messages' text part."""
    goal = "" if question.get("instructions") is None else text_of(question["instructions"])
    labels = [
        json.dumps(text_of(k if v is None else v), ensure_ascii=False)[1:-1] for k, v in question["criteria"].items()
    ]
    lines = "\n".join(f'{chr(65 + i)}. Decision "{label}" -> select' for i, label in enumerate(labels))
    return (
        (f"Goal: {goal}\n\n" if goal else "")
        + "App: Cua Driver\nTask family: closed-candidate decision\n\n"
        + "The current screenshot is attached.\n\n"
        + f"Options:\n{lines}\n\nAnswer with a single letter."
    )


def native_text(question: dict, image_tokens: int) -> str:
    """multimodal.rs chat_image(): the prompt as a literal string."""
    return (
        "<|im_start|>system\n"
        + SYSTEM_PROMPT
        + "<|im_end|>\n<|im_start|>user\n<|vision_start|>"
        + "<|image_pad|>" * image_tokens
        + "<|vision_end|>"
        + user_text(question)
        + "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


class Reference:
    def __init__(self, folder):
        self.processor = load_vl_processor(folder)
        self.tok = self.processor.tokenizer
        self.model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()

    def inputs(self, image, question: dict) -> tuple[str, dict]:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": [{"type": "image", "image": "inline.png"}, {"type": "text", "text": user_text(question)}],
            },
        ]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = dict(self.processor(text=[text], images=[image], return_tensors="pt"))
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == self.model.config.image_token_id).int()
        return text, inputs

    @torch.inference_mode()
    def probabilities(self, image, question: dict) -> list[float]:
        n = len(question["criteria"])
        letters = []
        for i in range(n):  # model.letter_ids
            encoded = self.tok.encode(chr(65 + i), add_special_tokens=False)
            assert len(encoded) == 1
            letters.append(encoded[0])
        logits = self.model(**self.inputs(image, question)[1]).logits[0, -1, :]
        return torch.softmax(logits[torch.tensor(letters)].float(), dim=-1).tolist()


@pytest.fixture(scope="module")
def cua_dir(tmp_path_factory) -> Path:
    from tools.tiny_cua_s1_checkpoint import make_tiny_cua_s1_screenshot

    return make_tiny_cua_s1_screenshot(tmp_path_factory.mktemp("cua-screenshot"), seed=11)


@pytest.fixture(scope="module")
def reference(cua_dir) -> Reference:
    return Reference(cua_dir)


def cua_recipe():
    recipe = load_recipe("cua-s1-4b-0.2-screenshot")
    model = recipe.model.model_copy(
        update={"hub_repo": "test/tiny-cua-screenshot", "revision": "local", "dtype": "float32"}
    )
    return recipe.model_copy(update={"name": "tiny-cua-screenshot", "model": model})


def encoded(image, fmt: str = "PNG", **save) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


def asset(data: bytes, fmt: str = "png") -> dict:
    return {"type": "image", "format": fmt, "data_base64": base64.b64encode(data).decode("ascii")}


PNG = encoded(pattern_image(3, SIZE))
JPEG = encoded(pattern_image(4, SIZE), "JPEG", quality=90)
GIF = encoded(pattern_image(5, SIZE), "GIF")
APNG = encoded(pattern_image(6, SIZE), "PNG", save_all=True, append_images=[pattern_image(7, SIZE)])
LARGE = encoded(pattern_image(8, (1200, 1000)))  # 1.2 million pixels, sides under 2048


def decoded(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def asset_dir(cua_dir, tmp_path_factory) -> str:
    """The preencoder's assets for every image the tests send (it encodes what its default limits allow)."""
    import asyncio

    from jev_preencoder.encode import Encoder
    from jev_preencoder.settings import PreencoderSettings

    out = str(tmp_path_factory.mktemp("assets"))
    encoder = Encoder(PreencoderSettings(model_path=str(cua_dir), device="cpu", dtype="float32", redis_url="none"))
    lines = [
        {"image": "data:image/png;base64," + asset(PNG)["data_base64"]},
        {"image": "data:image/jpeg;base64," + asset(JPEG)["data_base64"]},
        {"image": "data:image/gif;base64," + asset(GIF)["data_base64"]},
        {"image": "data:image/png;base64," + asset(APNG)["data_base64"]},
        {"image": "data:image/png;base64," + asset(LARGE)["data_base64"]},
    ]
    summary = asyncio.run(encoder.encode_lines(lines, out, None))
    assert summary.done == 5, summary.results
    return out


async def ask(front, state, questions: dict, assets: dict | None = None) -> tuple[int, dict]:
    body = {"model": "jev-latest", "state": state, "questions": questions}
    if assets is not None:
        body["assets"] = assets
    response = await front.post("/v1/systemone", json=body)
    return response.status, await response.json()


def test_the_prompt_is_upstreams_literal(reference):
    image = decoded(PNG)
    for question in (KEEP, ANY):
        text, inputs = reference.inputs(image, question)
        assert text == native_text(question, 1)  # no enable_thinking: the template's own "<think>\n"
        grid = inputs["image_grid_thw"][0].tolist()
        pads = grid[0] * grid[1] * grid[2] // 4
        assert reference.tok.decode(inputs["input_ids"][0]) == native_text(question, pads)
    assert user_text(KEEP) == (
        "Goal: Keep the files.\n\nApp: Cua Driver\nTask family: closed-candidate decision\n\n"
        'The current screenshot is attached.\n\nOptions:\nA. Decision "Click \\"Delete\\"" -> select\n'
        'B. Decision "cancel" -> select\nC. Decision "{\\"element\\": \\"window\\", \\"action\\": \\"close\\"}" '
        "-> select\n\nAnswer with a single letter."
    )
    assert user_text(ANY).startswith("App: Cua Driver\n")
    # enable_thinking=False would end the prompt otherwise: the tiny template tells the two apart
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "x"}]
    assert reference.processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    ).endswith("<think>\n\n</think>\n\n")


async def test_cua_s1_screenshot_answers_equal_its_contract(worker_settings, cua_dir, reference, asset_dir):
    from jev_common.assets import bytes_key
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    settings = worker_settings(recipe=cua_recipe(), model_path=str(cua_dir), asset_dir=asset_dir)
    async with served(settings) as (front, worker, service):
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert (serving["family"], serving["readout"], serving["question_types"]) == (
            "cua-s1-screenshot",
            "cua-s1-screenshot-labels",
            ["choice"],
        )
        assert serving["calibration"] == {"source": None, "temperature": 1.0}

        questions = {"keep": KEEP, "any": ANY, "route": ROUTE}
        for data, fmt in ((PNG, "png"), (JPEG, "jpeg")):
            code, body = await ask(front, "<image:screen>", questions, {"<image:screen>": asset(data, fmt)})
            assert code == 200, body
            image = decoded(data)
            for qid, question in questions.items():
                want = reference.probabilities(image, question)
                keys = list(question["criteria"])
                assert_probs(body["answers"][qid]["probabilities"], want, keys)
                assert body["answers"][qid]["choice"] == keys[max(range(len(keys)), key=want.__getitem__)]
            assert max(want) - min(want) > 1e-3

            # token ids: the worker's prefix + row of each question is the processor's input_ids
            model = service.model
            stored, _ = await model.assets.get_by_key(bytes_key(data))
            request = SystemOneRequest.model_validate(
                {"model": "jev-latest", "state": "<image:screen>", "questions": questions}
            )
            rows, plan = rows_for(request.questions, request.state, model.builder, model.readout.kinds)
            prepared = model.builder.prepare(model.image_placeholder(stored), rows, (stored.key,), plan)
            for row, question in zip(prepared.rows, questions.values()):
                want_ids = reference.inputs(image, question)[1]["input_ids"][0].tolist()
                assert list(prepared.prefix_ids + row) == want_ids

        # a single question on its own, its two labels one character apart
        one = {"type": "choice", "instructions": "Close it.", "criteria": {"a": "Close", "b": "Close."}}
        code, body = await ask(front, "<image:screen>", {"q": one}, {"<image:screen>": asset(PNG)})
        assert code == 200
        assert_probs(body["answers"]["q"]["probabilities"], reference.probabilities(decoded(PNG), one), ["a", "b"])


async def test_cua_s1_screenshot_refuses_what_upstream_refuses(worker_settings, cua_dir, asset_dir):
    from jev_common.assets import ImageAsset
    from jev_common.errors import ImageInvalid

    png = {"<image:screen>": asset(PNG)}
    settings = worker_settings(recipe=cua_recipe(), model_path=str(cua_dir), asset_dir=asset_dir)
    async with served(settings) as (front, _, service):

        async def refused(state, questions, assets, *needles):
            code, body = await ask(front, state, questions, assets)
            text = json.dumps(body)
            assert code == 422 and all(n in text for n in needles), (code, text)

        # the state is exactly one image
        one_image = "exactly one image and nothing else"
        await refused("A dialog asks to delete 3 files.", {"q": KEEP}, None, one_image)
        await refused("Screen: <image:screen>", {"q": KEEP}, png, one_image)
        await refused("<image:a><image:b>", {"q": KEEP}, {"<image:a>": asset(PNG), "<image:b>": asset(JPEG)}, one_image)
        await refused({"image": "data:image/png;base64," + asset(PNG)["data_base64"]}, {"q": KEEP}, None, one_image)
        # the image itself: PNG or JPEG, one frame, at most 1,048,576 pixels (from what the preencoder recorded)
        await refused("<image:screen>", {"q": KEEP}, {"<image:screen>": asset(GIF)}, "asset_invalid", "PNG or JPEG")
        await refused("<image:screen>", {"q": KEEP}, {"<image:screen>": asset(APNG)}, "asset_invalid", "single-frame")
        await refused(
            "<image:screen>", {"q": KEEP}, {"<image:screen>": asset(LARGE)}, "asset_invalid", "1048576 pixels"
        )
        # questions: choice only, 1..26 options, at most 8, names and keys of 256 characters, texts of 16384
        for question in ({"type": "noul", "instructions": "Is it open?"}, {"type": "score", "criteria": ["a", "b"]}):
            await refused("<image:screen>", {"q": question}, png, "unsupported_question_type")
        await refused(
            "<image:screen>",
            {"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(27)}}},
            png,
            "at most 26 options",
        )
        await refused("<image:screen>", {f"q{i}": ANY for i in range(9)}, png, "at most 8 questions")
        await refused("<image:screen>", {"q" * 257: ANY}, png, "at most 256 characters")
        await refused(
            "<image:screen>",
            {"q": {"type": "choice", "criteria": {"k" * 257: None, "b": None}}},
            png,
            "at most 256 characters",
        )
        await refused("<image:screen>", {"q": dict(KEEP, instructions="x" * 16385)}, png, "16384 characters")
        await refused(
            "<image:screen>",
            {"q": dict(KEEP, instructions="x" * 9000, criteria={"a": "y" * 8000, "b": None})},
            png,
            "combined question text exceeds 16384",
        )
        await refused("<image:screen>", {"q": dict(KEEP, instructions="龘" * 3000)}, png, "at most 4096")
        await refused("<image:screen>", {"q": dict(KEEP, instructions="see <|image_pad|>")}, png, "<|image_pad|>")

        # every image limit, on the asset's record alone
        builder, good = (
            service.model.builder,
            {
                "mime": "image/png",
                "format_detected": "PNG",
                "width": 1024,
                "height": 1024,
                "source_bytes": 4 * 1024 * 1024,
                "frames": 1,
            },
        )
        builder.check_image(ImageAsset("0" * 64, torch.zeros(4, 8), (1, 4, 4), good), "state")
        for change, needle in (
            ({"width": 2049, "height": 500}, "2048 pixels a side"),
            ({"width": 1025}, "1048576 pixels"),
            ({"width": 1000, "height": 4}, "200:1"),
            ({"source_bytes": 4 * 1024 * 1024 + 1}, "4 MiB"),
            ({"frames": 2}, "single-frame"),
            ({"mime": "image/webp", "format_detected": "WEBP"}, "PNG or JPEG"),
            ({"format_detected": "JPEG"}, "PNG or JPEG"),
            ({"width": None}, "prepare it again"),
        ):
            with pytest.raises(ImageInvalid, match=needle):
                builder.check_image(ImageAsset("0" * 64, torch.zeros(4, 8), (1, 4, 4), {**good, **change}), "state")


def test_the_readout_refuses_thinking_kwargs_and_the_profile_bounds_the_preencoder():
    from jev_common.checkpoint_files import ServingError
    from jev_worker.families.cua_s1.screenshot import CuaS1ScreenshotLabels

    recipe = cua_recipe()
    thinking = recipe.model_copy(
        update={"prompt": recipe.prompt.model_copy(update={"chat_template_kwargs": {"enable_thinking": False}})}
    )

    class Builder:
        recipe = thinking

    with pytest.raises(ServingError, match="enable_thinking"):
        CuaS1ScreenshotLabels().load(None, Builder())
    compose = yaml.safe_load((Path(__file__).resolve().parents[3] / "docker-compose.yml").read_text())
    env = compose["services"]["preencoder-cua-s1-screenshot"]["environment"]
    assert (env["JEV_PREENCODER_MAX_IMAGE_BYTES"], str(env["JEV_PREENCODER_MAX_IMAGE_PIXELS"])) == ("4M", "1048576")
