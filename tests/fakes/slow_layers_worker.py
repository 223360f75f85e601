"""`python -m tests.fakes.slow_layers_worker`: the real worker (jev_worker's main), whose decoder layers each
sleep JEV_TEST_LAYER_S seconds while the file JEV_TEST_SLOW_FLAG exists (so loading and warmup stay fast and
a test turns a tiny model into a long forward when it wants one)."""

from __future__ import annotations

import os
import time

from transformers.models.llama import modeling_llama

DELAY_S = float(os.environ.get("JEV_TEST_LAYER_S", "1"))
FLAG = os.environ.get("JEV_TEST_SLOW_FLAG", "")
_forward = modeling_llama.LlamaDecoderLayer.forward


def _slow_forward(self, *args, **kwargs):
    if FLAG and os.path.exists(FLAG):
        time.sleep(DELAY_S)
    return _forward(self, *args, **kwargs)


modeling_llama.LlamaDecoderLayer.forward = _slow_forward

if __name__ == "__main__":
    from jev_worker.__main__ import main

    main()
