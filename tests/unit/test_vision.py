"""The worker's image path on the tiny Qwen2-VL: stored embeddings spliced into the prompt give the
model's own end-to-end answer on the raw image; M-RoPE positions split cleanly at a cached prefix."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from jev_common.assets import ImageAsset, asset_key, read_asset
from jev_worker.loading import vision

from .vl_helpers import PROMPT_TEXT, pattern_image, png_uri, request_line, tiny_encoder

TOL = 1e-5


@pytest.fixture(scope="module")
def encoder():
    return tiny_encoder()


def _messages(question: str = PROMPT_TEXT) -> list[dict]:
    return [
        {"role": "system", "content": "You look at pictures."},
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": f"State: a picture.\nQuestion: {question}"}],
        },
    ]


async def _prepared_asset(encoder, tmp_path, seed: int = 0, size=(56, 56)) -> tuple[ImageAsset, object]:
    uri = png_uri(seed, size)
    summary = await encoder.encode_lines([request_line(uri)], str(tmp_path), None)
    assert summary.done == 1, summary.results
    asset = read_asset(
        tmp_path, asset_key(uri), identity=encoder.identity, processor_identity=encoder.processor_identity
    )
    return asset, pattern_image(seed, size)


def _served_ids(encoder, asset: ImageAsset, question: str = PROMPT_TEXT) -> torch.Tensor:
    """The prompt as the worker builds it: placeholder text in place of the image, plain tokenising."""
    processor = encoder.processor
    text = processor.apply_chat_template(_messages(question), add_generation_prompt=True, tokenize=False)
    image_part = "<|vision_start|><|image_pad|><|vision_end|>"
    assert text.count(image_part) == 1
    text = text.replace(image_part, vision.image_placeholder(processor, asset))
    return torch.tensor([processor.tokenizer(text, add_special_tokens=False)["input_ids"]])


@torch.inference_mode()
def _reference(encoder, image, question: str = PROMPT_TEXT):
    """The model's own end-to-end forward on the raw image: processor(text, images) -> model(**inputs)."""
    processor, model = encoder.processor, encoder.model
    text = processor.apply_chat_template(_messages(question), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    out = model(**inputs, output_hidden_states=False)
    hidden = model.model(**inputs).last_hidden_state
    return inputs, hidden[0, -1], out.logits[0, -1]


@torch.inference_mode()
def _spliced(encoder, ids, asset):
    model = encoder.model
    embeds, positions, delta = vision.splice_image_embeds(model, ids, [asset])
    hidden = model.get_decoder()(inputs_embeds=embeds, position_ids=positions).last_hidden_state
    return hidden[0, -1], model.lm_head(hidden)[0, -1], positions, delta  # lm_head on [1, L, H] as forward does


async def test_spliced_assets_match_end_to_end_forward(encoder, tmp_path):
    asset, image = await _prepared_asset(encoder, tmp_path)
    assert asset.grid_thw == (1, 4, 4) and asset.n_tokens == 4
    assert asset.embeds.dtype == torch.float32
    inputs, ref_hidden, ref_logits = _reference(encoder, image)
    ids = _served_ids(encoder, asset)
    assert ids.tolist() == inputs["input_ids"].tolist(), "placeholder text must tokenise as the processor expands it"
    hidden, logits, positions, _delta = _spliced(encoder, ids, asset)
    assert torch.allclose(hidden, ref_hidden, atol=TOL, rtol=0), (hidden - ref_hidden).abs().max()
    assert torch.allclose(logits, ref_logits, atol=TOL, rtol=0), (logits - ref_logits).abs().max()
    # the comparison is sensitive: plain 1-D positions or another image move the logits far beyond TOL
    with torch.inference_mode():
        model = encoder.model
        embeds, _, _ = vision.splice_image_embeds(model, ids, [asset])
        flat = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
        wrong = model.lm_head(model.get_decoder()(inputs_embeds=embeds, position_ids=flat).last_hidden_state[0, -1])
    assert (wrong - ref_logits).abs().max() > 1e-3
    other, _ = await _prepared_asset(encoder, tmp_path, seed=3)
    _, other_logits, _, _ = _spliced(encoder, ids, other)
    assert (other_logits - ref_logits).abs().max() > 1e-3


async def test_larger_image_and_cached_prefix_split(encoder, tmp_path):
    """A 112x84 image (grid [1, 8, 6], 12 tokens); prefix (system + image + state) run with a KV
    cache, then the question row with text_positions: same last hidden state as the full forward."""
    asset, image = await _prepared_asset(encoder, tmp_path, seed=5, size=(84, 112))
    assert asset.grid_thw == (1, 8, 6) and asset.n_tokens == 12
    inputs, ref_hidden, ref_logits = _reference(encoder, image)
    ids = _served_ids(encoder, asset)
    assert ids.tolist() == inputs["input_ids"].tolist()
    tokenizer = encoder.processor.tokenizer
    split = ids[0].tolist().index(tokenizer.convert_tokens_to_ids("<|vision_end|>")) + 3  # a few state tokens in
    prefix, suffix = ids[:, :split], ids[:, split:]
    model = encoder.model
    decoder = model.get_decoder()
    with torch.inference_mode():
        embeds, positions, delta = vision.splice_image_embeds(model, prefix, [asset])
        cache = DynamicCache()
        decoder(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True)
        suffix_positions = vision.text_positions(split, suffix.shape[1], delta, 1)
        hidden = decoder(input_ids=suffix, position_ids=suffix_positions, cache=cache, use_cache=True).last_hidden_state
    assert torch.allclose(hidden[0, -1], ref_hidden, atol=TOL, rtol=0), (hidden[0, -1] - ref_hidden).abs().max()
    # logits are ~20 in size here: through the cache path (other matmul shapes) compare them relative to that
    scale = float(ref_logits.abs().max())
    assert torch.allclose(model.lm_head(hidden)[0, -1], ref_logits, atol=TOL * scale, rtol=0)
    # the split positions are the full sequence's positions
    _, full_positions, full_delta = vision.splice_image_embeds(model, ids, [asset])
    assert full_delta == delta
    assert torch.equal(torch.cat([positions, suffix_positions], dim=-1), full_positions)


def _fake_asset(grid=(1, 4, 4), hidden=64, seed=0) -> ImageAsset:
    generator = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1] * grid[2] // 4
    embeds = torch.randn(n, hidden, generator=generator)
    return ImageAsset(key="0" * 64, embeds=embeds, grid_thw=grid, meta={"merge_size": 2}, nbytes=embeds.numel() * 4)


def test_placeholder_and_positions_on_a_fixed_grid(encoder):
    """grid [1,4,4], merge 2 -> 4 tokens at t=k, h=k+[0,0,1,1], w=k+[0,1,0,1]; text after the image
    continues at max+1; the suffix positions after a split equal the full sequence's."""
    processor, model = encoder.processor, encoder.model
    asset = _fake_asset()
    placeholder = vision.image_placeholder(processor, asset)
    assert placeholder == "<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>"
    assert vision.image_placeholder(processor.tokenizer, asset) == placeholder
    tokenizer = processor.tokenizer
    head = tokenizer("ab cd", add_special_tokens=False)["input_ids"]
    tail = tokenizer(" then some text", add_special_tokens=False)["input_ids"]
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    ids = torch.tensor([head + tokenizer(placeholder, add_special_tokens=False)["input_ids"] + tail])
    k = len(head) + 1  # text (head + vision_start) takes positions 0..k-1
    assert ids[0, k : k + 4].tolist() == [pad] * 4
    embeds, positions, delta = vision.splice_image_embeds(model, ids, [asset])
    assert positions.shape == (3, 1, ids.shape[1])
    expected_image = [[k, k, k, k], [k, k, k + 1, k + 1], [k, k + 1, k, k + 1]]
    assert positions[:, 0, k : k + 4].tolist() == expected_image
    assert positions[:, 0, :k].tolist() == [list(range(k))] * 3
    after = list(range(k + 2, k + 2 + ids.shape[1] - (k + 4)))  # vision_end and the tail: max + 1 onwards
    assert positions[:, 0, k + 4 :].tolist() == [after] * 3
    assert delta == (k + 2 + ids.shape[1] - (k + 4)) - ids.shape[1]  # max + 1 - length
    # embeddings: the asset rows at the pads, the embedding table elsewhere
    table = model.get_input_embeddings()
    with torch.inference_mode():
        assert torch.equal(embeds[0, k : k + 4], asset.embeds)
        assert torch.equal(embeds[0, :k], table(ids[0, :k]))
    # suffix rows after a cached prefix, batched
    for split in (k + 4, k + 5, ids.shape[1] - 1):
        rows = vision.text_positions(split, ids.shape[1] - split, delta, 3)
        assert rows.shape == (3, 3, ids.shape[1] - split)
        for row in range(3):
            assert torch.equal(rows[:, row], positions[:, 0, split:])
    per_row = vision.text_positions(10, 2, torch.tensor([0, -2]), 2)
    assert per_row[:, 0].tolist() == [[10, 11]] * 3 and per_row[:, 1].tolist() == [[8, 9]] * 3


def test_splice_rejects_mismatched_prompts(encoder):
    model = encoder.model
    tokenizer = encoder.processor.tokenizer
    asset = _fake_asset()
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    three_pads = torch.tensor([[1, pad, pad, pad, 2]])
    with pytest.raises(ValueError, match="3 image-pad tokens"):
        vision.splice_image_embeds(model, three_pads, [asset])
    from jev_common.errors import DomainError

    wide = _fake_asset(hidden=65)
    ids = torch.tensor([[1] + [pad] * 4 + [2]])
    with pytest.raises(DomainError) as info:
        vision.splice_image_embeds(model, ids, [wide])
    assert info.value.type == "asset_invalid"
    bad_grid = ImageAsset(key="1" * 64, embeds=torch.zeros(5, 64), grid_thw=(1, 4, 4), meta={"merge_size": 2})
    with pytest.raises(DomainError) as info:
        vision.image_placeholder(encoder.processor, bad_grid)
    assert info.value.type == "asset_invalid" and "1" * 64 in info.value.message
