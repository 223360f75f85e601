"""A bare llama.cpp System One scorer with prefix reuse: a peer for benchmarks/peers.py.

    PYTHONPATH=services benchmarks/peers/.venv/bin/python benchmarks/peers/llama_scorer.py \
        --gguf FILE --port P [--threads N]      (or PEER_GGUF, PEER_PORT, PEER_THREADS)

It serves `POST /v1/systemone` (the envelope only: noul, choice, score) and `GET /health` on
127.0.0.1. Prompts are built by the worker's own code (services/jev_worker: ChatPromptBuilder and the
question modules, with the tokenizer transformers reads from the same GGUF), so every row is scored
on exactly the token ids the worker scores; only the engine differs: llama.cpp's Q4_1 kernels
instead of the GGUF dequantised to FP32 in torch. That is what makes its answers the
identical-ids comparison of the peer benchmark.

Prefix reuse, as llama.cpp's own server does it, plus a small LRU of prefix states:
- the context keeps its last sequence; a row whose prefix is already there evaluates only the row;
- a prefix seen before (another state in between) is restored from its saved sequence state
  (llama_state_seq_get_data / set_data, a few MB, a memcpy) instead of being evaluated again;
- rows of one request run one after another after the shared prefix (no batching: it is bare).

One request at a time (a lock): llama.cpp contexts are not thread-safe. Run in the peers' venv
(benchmarks/peers/install.sh) with PYTHONPATH=services.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


class PrefixScorer:
    """Label logits of `prefix + row` token ids with llama.cpp, reusing prefixes."""

    def __init__(self, gguf: str, *, threads: int, n_ctx: int = 4096, cache_entries: int = 64):
        import llama_cpp
        from llama_cpp import Llama

        self._lib = llama_cpp
        self.llm = Llama(
            model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False
        )
        self.n_vocab = self.llm.n_vocab()
        self.cache: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        self.cache_entries = cache_entries
        self.stats = {"prefix_live": 0, "prefix_restored": 0, "prefix_evaluated": 0, "rows": 0}

    @property
    def _ctx(self):
        return self.llm._ctx.ctx

    def _live_prefix_length(self, prefix: tuple[int, ...]) -> int:
        n = min(self.llm.n_tokens, len(prefix))
        live = self.llm.input_ids[:n]
        same = np.asarray(prefix[:n], dtype=live.dtype) == live
        return n if same.all() else int(np.argmin(same))

    def _save(self, prefix: tuple[int, ...]) -> None:
        lib = self._lib
        size = lib.llama_state_seq_get_size(self._ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = lib.llama_state_seq_get_data(self._ctx, buf, size, 0)
        self.cache[prefix] = bytes(buf[:written])
        self.cache.move_to_end(prefix)
        while len(self.cache) > self.cache_entries:
            self.cache.popitem(last=False)

    def _restore(self, prefix: tuple[int, ...], data: bytes) -> bool:
        lib = self._lib
        self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if lib.llama_state_seq_set_data(self._ctx, buf, len(data), 0) != len(data):
            self.llm.n_tokens = 0
            return False
        self.llm.input_ids[: len(prefix)] = prefix
        self.llm.n_tokens = len(prefix)
        self.cache.move_to_end(prefix)
        return True

    def _ensure_prefix(self, prefix: tuple[int, ...]) -> None:
        live = self._live_prefix_length(prefix)
        if live == len(prefix):
            self.stats["prefix_live"] += 1
            return
        data = self.cache.get(prefix)
        if data is not None and self._restore(prefix, data):
            self.stats["prefix_restored"] += 1
            return
        self.llm.n_tokens = live  # eval() drops the KV beyond n_tokens first
        self.llm.eval(list(prefix[live:]))
        self.stats["prefix_evaluated"] += 1
        self._save(prefix)

    def label_logits(self, prefix: tuple[int, ...], row: tuple[int, ...], labels: tuple[int, ...]) -> np.ndarray:
        if prefix:
            self._ensure_prefix(prefix)
            self.llm.n_tokens = len(prefix)
        else:
            self.llm.n_tokens = 0
        self.llm.eval(list(row))
        self.stats["rows"] += 1
        logits = np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))
        return logits[list(labels)].astype(np.float32, copy=True)


class EnvelopeScorer:
    """System One envelopes -> answers, with the worker's prompt and answer code around PrefixScorer."""

    def __init__(self, gguf: str, threads: int, recipe: str = "smollm2-135m-cpu"):
        import torch
        from transformers import AutoTokenizer

        from jev_common.recipe import load_recipe
        from jev_worker.prompt.builder import ChatPromptBuilder
        from jev_worker.questions import plan as question_plan
        from jev_worker.request import envelope

        torch.set_num_threads(1)  # only softmaxes over a few labels run in torch here
        self._torch = torch
        self._envelope = envelope
        self._plan = question_plan
        self.recipe = load_recipe(recipe)
        path = Path(gguf)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        self.builder = ChatPromptBuilder(tokenizer, self.recipe, f"llama.cpp:{path.name}")
        self.scorer = PrefixScorer(gguf, threads=threads)
        self.model_name = f"llama.cpp:{path.name}"

    def decide(self, payload: dict) -> dict:
        from jev_common.schema import SystemOneRequest

        started = time.perf_counter()
        request = SystemOneRequest.model_validate(payload)
        rows, plan = self._plan.question_rows(request, self.builder)
        state_text = self._envelope.render_state(request)
        prepared = self.builder.prepare(state_text, rows, plan=plan)
        logits = [
            self._torch.from_numpy(self.scorer.label_logits(prepared.prefix_ids, row, labels))
            for row, labels in zip(prepared.rows, prepared.row_labels)
        ]
        answers = self._plan.answers(plan, logits, self.builder)
        return {
            "model": self.model_name,
            "answers": {qid: a.model_dump(mode="json") for qid, a in answers.items()},
            "usage": {"input_tokens": prepared.prompt_tokens, "output_tokens": 0},
            "x_elapsed_seconds": time.perf_counter() - started,
        }


def make_app(scorer: EnvelopeScorer):
    lock = asyncio.Lock()

    async def respond(send, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": raw})

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/health" and method == "GET":
            return await respond(
                send, 200, {"status": "ok", "model": scorer.model_name, "prefix_stats": scorer.scorer.stats}
            )
        if path not in ("/v1/systemone", "/systemone") or method != "POST":
            return await respond(send, 404, {"detail": {"error_type": "not_found", "message": path}})
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        try:
            payload = json.loads(b"".join(chunks))
        except ValueError as exc:
            return await respond(send, 422, {"detail": {"error_type": "validation_error", "message": str(exc)}})
        async with lock:
            try:
                body = await asyncio.to_thread(scorer.decide, payload)
            except Exception as exc:  # noqa: BLE001 - a peer reports, the benchmark counts it
                status = getattr(exc, "status", 422 if type(exc).__name__ == "ValidationError" else 500)
                return await respond(
                    send, status, {"detail": {"error_type": type(exc).__name__, "message": str(exc)[:500]}}
                )
        await respond(send, 200, body)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", default=os.environ.get("PEER_GGUF"), required="PEER_GGUF" not in os.environ)
    parser.add_argument("--port", type=int, default=os.environ.get("PEER_PORT"), required="PEER_PORT" not in os.environ)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("PEER_THREADS") or os.cpu_count() or 1))
    args = parser.parse_args(argv)
    for path in (str(REPO / "services"), str(REPO)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import uvicorn

    scorer = EnvelopeScorer(args.gguf, args.threads)
    scorer.decide(
        {
            "model": "x",
            "state": "The lamp is on.",  # warm up before /health answers
            "questions": {"on": {"type": "noul", "instructions": "Is the lamp on?"}},
        }
    )
    uvicorn.run(
        make_app(scorer), host="127.0.0.1", port=args.port, log_level="warning", lifespan="off", access_log=False
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
