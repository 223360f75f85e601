"""vLLM Semantic Router's own toy fixture for the Vela 2.0 layouts, copied literally from
vllm-project/semantic-router src/model-runtime/tests/test_vela2_layout.py @ 4d51146aef3832b75e2a1472af8d8936d26e5a63
(`_encode`, `MARKER_IDS`, the `encoder()` config's bos 2 / eos 1): one token per character (spaces included), so token
positions equal code points, and the eight markers at 2000 + their index in encoder_layout.MARKERS. The packages'
engine (`vela2_inference.py`, `schema_lib.assemble`) is not public; that runtime reimplements it
(src/model-runtime/vllm_srun/families/vela2/) and its tests pin the layouts on this fixture. Used by
test_vela_encoder.py and test_vela_decoder.py to replay those tests' golden assertions on our layouts."""

from __future__ import annotations

MARKERS = ("[Q]", "[O]", "[ABS]", "[SEP_SCHEMA]", "[SEG_user]", "[SEG_answer]", "[E]", "[SEG_context]")
MARKER_IDS = {name: 2000 + index for index, name in enumerate(MARKERS)}
BOS, EOS = 2, 1


class Encoding:
    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets


def encode(text: str) -> Encoding:
    """One token per character (spaces included), so token positions equal code points."""
    return Encoding([10 + ord(c) % 1000 for c in text], [(i, i + 1) for i in range(len(text))])


class ToyTokenizer:
    """`encode` behind the interface of a tokenizers.Tokenizer (what the marker builder calls)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        assert not add_special_tokens
        return encode(text)


def text_of(ids) -> str:
    """Toy-tokenised ids written out: markers by name, bos / eos as <bos> / <eos>, text as its characters."""
    names = {v: k for k, v in MARKER_IDS.items()} | {BOS: "<bos>", EOS: "<eos>"}
    return "".join(names.get(i) or chr(i - 10) for i in ids)
