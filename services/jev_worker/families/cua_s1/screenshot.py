"""cua-s1-screenshot-labels: Cua-S1 4B 0.2's multimodal-adapter contract (system1-omni
`src/models/cua_s1/multimodal/protocol.py` and `model.py`; the rendered text as `native/src/multimodal.rs`
`chat_image` writes it), on the causal-lm backend.

The state is one screenshot and nothing else. Upstream's state is `{"image": data_url}`; in this API that is an
image asset whose reference is the whole state (`"state": "<image:screen>"` with the asset under `assets`),
prepared by the preencoder. Anything else (text, text beside the image, two images) is 422. One row per question,
after the recipe's system prompt (the text adapter's), the chat template's generation prompt, no thinking
kwargs; the image comes first in the user turn, the text right after it:

    <|vision_start|><|image_pad|>*N<|vision_end|> ["Goal: " GOAL "\\n\\n"]
    "App: Cua Driver\\nTask family: closed-candidate decision\\n\\n" "The current screenshot is attached.\\n\\n"
    "Options:\\n" ('A. Decision "LABEL" -> select' per option, by lines) "\\n\\nAnswer with a single letter."

GOAL and LABEL as the text adapter's (readout.py). The image is the state prefix (L3), shared by the
questions; each question is a row after it. Probabilities: a float32 softmax over the option letters' logits at
the last position (no temperature, no calibration file). Upstream's limits: choice only, 1 to 26 options, at
most 8 questions, names and option keys of at most 256 characters, each text at most 16384 characters and a
question's goal + labels together too, a prompt of at most 4096 tokens (image tokens included); the image PNG
or JPEG, one frame, at most 4 MiB, 2048 pixels a side, 1,048,576 pixels and an aspect ratio of 200. The worker
never decodes pixels: the image limits are checked on what the preencoder recorded in the asset (its grid and
the source image's format, size, byte count and frame count), and the recipe's preencoder refuses larger images
before encoding them (JEV_PREENCODER_MAX_IMAGE_BYTES / _PIXELS in its compose profile).
"""

from __future__ import annotations

from jev_common.assets import ImageAsset, short_key
from jev_common.checkpoint_files import ServingError
from jev_common.errors import ImageInvalid, UnreadableInput
from jev_common.schema import ChoiceQuestion

from ...loading.vision import IMAGE_ITEM, PLACED_IMAGE
from ...prompt.builder import ChatPromptBuilder, PreparedRequest, RowSpec
from ...questions.base import BuildContext
from .readout import CuaChoice, CuaS1Labels, option_sources

SCREENSHOT_LINE = "The current screenshot is attached.\n\n"
IMAGE_MARKER = "inline.png"  # protocol.build_messages: the image part's value, a marker never opened
MAX_QUESTIONS, MAX_NAME, MAX_TEXT, MAX_TOKENS = 8, 256, 16384, 4096
MAX_IMAGE_BYTES, MAX_SIDE, MAX_PIXELS, MAX_ASPECT_RATIO = 4 * 1024 * 1024, 2048, 1024 * 1024, 200
FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG"}


class ScreenshotChoice(CuaChoice):
    """The multimodal adapter's choice: the screenshot line where the text adapter shows the tree."""

    def state_block(self, ctx: BuildContext, where: str) -> str:
        return SCREENSHOT_LINE

    def texts(self, question: ChoiceQuestion, where: str) -> tuple[str, list[str]]:
        for name in question.criteria:
            if len(name) > MAX_NAME:
                raise UnreadableInput(f"{where}.criteria: option keys of at most {MAX_NAME} characters for this model")
        goal, labels = super().texts(question, where)
        if len(goal) > MAX_TEXT or any(len(source) > MAX_TEXT for source in option_sources(question)):
            raise UnreadableInput(
                f"{where}: instructions and each option's text of at most {MAX_TEXT} characters for this model"
            )
        if len(goal) + sum(map(len, labels)) > MAX_TEXT:
            raise UnreadableInput(f"{where}: combined question text exceeds {MAX_TEXT} characters")
        return goal, labels


class ScreenshotBuilder(ChatPromptBuilder):
    """The recipe's chat template around upstream's user turn: the image item first, the question text after."""

    def __init__(self, tokenizer, recipe, identity: str):
        super().__init__(tokenizer, recipe, identity)
        probe = "\u2063jev-layout-probe\u2063"
        system = [{"role": "system", "content": recipe.prompt.system}] if recipe.prompt.system else []
        user = {"role": "user", "content": [{"type": "image", "image": IMAGE_MARKER}, {"type": "text", "text": probe}]}
        rendered = tokenizer.apply_chat_template(
            system + [user], tokenize=False, add_generation_prompt=True, **recipe.prompt.chat_template_kwargs
        )
        if rendered != self.layout.head + IMAGE_ITEM + probe + self.layout.tail:
            raise ServingError(
                f"recipe {recipe.name}: the chat template does not render an image item then text "
                f"as {IMAGE_ITEM!r} directly followed by the text in the user turn"
            )

    def state_block(self, state_text: str) -> str:
        return state_text  # the placed image only (checked in prepare)

    def prepare(
        self, state_text: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        if len(image_keys) != 1 or not PLACED_IMAGE.fullmatch(state_text):
            raise UnreadableInput(
                "state: Cua-S1's screenshot contract reads exactly one image and nothing else: "
                "send the screenshot as an asset and make the state its reference alone, e.g. "
                '"state": "<image:screen>" with "assets": {"<image:screen>": {...}}'
            )
        if plan is not None:  # the envelope's plan: its questions
            if len(plan.questions) > MAX_QUESTIONS:
                raise UnreadableInput(f"questions: at most {MAX_QUESTIONS} questions for this model")
            for question in plan.questions:
                if len(question.qid) > MAX_NAME:
                    raise UnreadableInput(f"questions: names of at most {MAX_NAME} characters for this model")
        prepared = super().prepare(state_text, rows, image_keys, plan)
        longest = len(prepared.prefix_ids) + max(len(row) for row in prepared.rows)
        if longest > MAX_TOKENS:
            raise UnreadableInput(
                f"a question's processed prompt is {longest} tokens (image tokens included); "
                f"this model reads at most {MAX_TOKENS}"
            )
        return prepared

    def check_image(self, asset: ImageAsset, where: str) -> None:
        meta, name = asset.meta, f"{where}: image {short_key(asset.key)}"
        width, height, size = meta.get("width"), meta.get("height"), meta.get("source_bytes")
        mime, detected = meta.get("mime"), meta.get("format_detected")
        if not all(isinstance(x, int) for x in (width, height, size)) or detected is None:
            raise ImageInvalid(
                f"{name}: its asset does not record the image's size and format, which this model's "
                "contract checks; prepare it again with this stack's preencoder"
            )
        if FORMATS.get(mime) is None or detected != FORMATS[mime]:
            raise ImageInvalid(f"{name} is {detected} sent as {mime}; this model reads PNG or JPEG screenshots only")
        if asset.grid_thw[0] != 1 or meta.get("frames", 1) != 1:
            raise ImageInvalid(f"{name} has several frames; this model reads single-frame screenshots only")
        if size > MAX_IMAGE_BYTES:
            raise ImageInvalid(f"{name} is {size} bytes; this model reads screenshots of at most 4 MiB")
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise ImageInvalid(
                f"{name} is {width}x{height}; this model reads aspect ratios of at most {MAX_ASPECT_RATIO}:1"
            )
        if max(width, height) > MAX_SIDE or width * height > MAX_PIXELS:
            raise ImageInvalid(
                f"{name} is {width}x{height}; this model reads screenshots of at most {MAX_SIDE} "
                f"pixels a side and {MAX_PIXELS} pixels"
            )


class CuaS1ScreenshotLabels(CuaS1Labels):
    """On the causal-lm backend; the image is the state prefix, each question a row after it."""

    name = "cua-s1-screenshot-labels"
    choice = ScreenshotChoice

    def prompt_builder(self, tokenizer, recipe, identity: str) -> ScreenshotBuilder:
        return ScreenshotBuilder(tokenizer, recipe, identity)

    def load(self, loaded, builder) -> None:
        if builder.recipe.prompt.chat_template_kwargs:
            raise ServingError(
                f"readout {self.name!r} renders the chat template as upstream does, with no extra "
                "variables (no enable_thinking: the generation prompt is the template's own)"
            )
        super().load(loaded, builder)

    def warmup_request(self, request):
        return None  # every request's state is a caller's prepared screenshot: ready once loaded
