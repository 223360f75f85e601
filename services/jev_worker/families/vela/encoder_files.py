"""A Vela 2.0 0.3B package's encoder files, as the `encoder` backend reads them (package code never imported).

`config.json` (model_type `vela2-unified`) holds the ModernBERT encoder's configuration under
`encoder_config`, and the ids of `bos_token_id` / `eos_token_id` / `pad_token_id`; `tokenizer.json` is the
package's tokenizer, read without its eight marker tokens (`marker_ids`): the sequence builder places
markers by id, so text never makes one (vLLM-SR reads the package the same way).
"""

from __future__ import annotations

import json
import os

from jev_common.checkpoint_files import ServingError, read_json

from ...backends.encoder import EncoderFiles

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
ENCODER_TYPE = "modernbert"
NOT_CONFIG = ("model_type", "architectures", "transformers_version")


def _field(config: dict, key: str):
    if key not in config:
        raise ServingError(f"{CONFIG} has no {key!r}; a Vela 2.0 0.3B package names it")
    return config[key]


class VelaEncoderFiles(EncoderFiles):
    needed = (CONFIG, TOKENIZER)
    config_source = "config.json encoder_config"

    def config(self, folder: str):
        from transformers import ModernBertConfig

        encoder = _field(read_json(os.path.join(folder, CONFIG)), "encoder_config")
        if not isinstance(encoder, dict) or encoder.get("model_type", ENCODER_TYPE) != ENCODER_TYPE:
            raise ServingError(
                f"{CONFIG}: encoder_config must be a {ENCODER_TYPE} configuration, got "
                f"{encoder.get('model_type') if isinstance(encoder, dict) else encoder!r}"
            )
        return ModernBertConfig(**{k: v for k, v in encoder.items() if k not in NOT_CONFIG})

    def tokenizer(self, folder: str):
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        config = read_json(os.path.join(folder, CONFIG))
        markers = set(_field(config, "marker_ids"))
        with open(os.path.join(folder, TOKENIZER), encoding="utf-8") as handle:
            data = json.load(handle)
        data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["content"] not in markers]
        text = Tokenizer.from_str(json.dumps(data))
        text.no_padding()
        text.no_truncation()
        named = {role: text.id_to_token(int(_field(config, f"{role}_token_id"))) for role in ("bos", "eos", "pad")}
        return PreTrainedTokenizerFast(
            tokenizer_object=text, bos_token=named["bos"], eos_token=named["eos"], pad_token=named["pad"]
        )
