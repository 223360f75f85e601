"""GPU check of the compiled causal-conv1d (the CUDA image's, or a wheel carried to a GPU machine) and of LFM2's
conv path served through it.

    python -m benchmarks.gpu_conv --out "$OUT"      # on a CUDA machine (benchmarks/gpu.sh runs it first)
    python -m benchmarks.gpu_conv --small           # CPU dry run: the LFM2 part only, on PyTorch's fallback

1. Kernel vs reference: `causal_conv1d_fn` (prefill) and `causal_conv1d_update` (one step on a rolling state)
   against a depthwise `torch.nn.functional.conv1d` written here, FP32 and BF16, with and without bias and SiLU,
   kernel widths 3 (LFM2's conv_L_cache) and 4, sequence lengths 1..4096.
2. LFM2 through it: a tiny random-weight LFM2 (tools/tiny_lfm2_checkpoint.py) on the GPU: the profiler shows
   the forward launching causal-conv1d's kernel (not the PyTorch fallback), and its logits equal the CPU FP32
   forward of the same weights within the dtype's tolerance.
3. Served: `python -m jev_worker` on that checkpoint (recipe lfm2.5-350m) on the device, /health listing
   causal-conv1d's version under `kernels`, a System One request answered and equal to the CPU answer.

Writes gpu_conv.json and gpu_conv.md under --out. Exit status: 0 passed, 1 a check failed, 3 no CUDA or no
causal-conv1d (without --small).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (str(REPO / "services"), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}  # max |kernel - reference| relative to max |reference|
SHAPES = [(1, 64, 1), (2, 1024, 17), (4, 2048, 512), (1, 1024, 4096)]  # (batch, channels, length)


def reference_conv(x, weight, bias, activation):
    """Causal depthwise conv: out[:, c, t] = sum_k w[c, k] * x[:, c, t - (K-1) + k] (+ bias), then SiLU."""
    import torch.nn.functional as F

    width = weight.shape[-1]
    out = F.conv1d(
        F.pad(x.float(), (width - 1, 0)),
        weight.float().unsqueeze(1),
        None if bias is None else bias.float(),
        groups=x.shape[1],
    )
    return F.silu(out) if activation == "silu" else out


def kernel_checks(device: str) -> list[dict]:
    import torch
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update

    rows = []
    torch.manual_seed(0)
    for dtype_name in ("float32", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        for batch, channels, length in SHAPES:
            for width in (3, 4):
                for with_bias, activation in ((False, None), (True, "silu")):
                    x = torch.randn(batch, channels, length, device=device, dtype=dtype)
                    w = torch.randn(channels, width, device=device, dtype=dtype) / width
                    b = torch.randn(channels, device=device, dtype=dtype) if with_bias else None
                    want = reference_conv(x, w, b, activation)
                    got = causal_conv1d_fn(x, w, b, activation=activation).float()
                    error = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
                    # one decode step: the state holds the last width-1 inputs; compare with the prefill's last column
                    state = x[:, :, -width:-1].contiguous() if length >= width else None
                    step_error = None
                    if state is not None:
                        padded = torch.cat([torch.zeros_like(state[:, :, :1]), state], dim=-1)
                        stepped = causal_conv1d_update(x[:, :, -1:].contiguous(), padded, w, b, activation).float()
                        step_error = (
                            (stepped[:, :, -1] - want[:, :, -1]).abs().max()
                            / want[:, :, -1].abs().max().clamp_min(1e-6)
                        ).item()
                    worst = max(error, step_error or 0.0)
                    rows.append(
                        {
                            "dtype": dtype_name,
                            "shape": [batch, channels, length],
                            "width": width,
                            "bias": with_bias,
                            "activation": activation,
                            "rel_error": error,
                            "update_rel_error": step_error,
                            "passed": worst <= TOLERANCE[dtype_name],
                        }
                    )
    return rows


def lfm2_forward_check(device: str, dtype_name: str, folder: Path) -> dict:
    """Logits of the tiny LFM2 on `device` vs CPU FP32; which conv kernels the device forward launched."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.randint(5, 1000, (2, 96), generator=torch.Generator().manual_seed(1))
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        want = reference(input_ids=ids).logits.float()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype_name)).to(device).eval()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        got = model(input_ids=ids.to(device)).logits.float().cpu()
    names = {e.key for e in prof.key_averages()}
    conv_kernels = sorted(n for n in names if "causal_conv1d" in n.lower())
    error = ((got - want).abs().max() / want.abs().max()).item()
    return {
        "rel_error": error,
        "tolerance": TOLERANCE[dtype_name],
        "conv_kernels": conv_kernels[:6],
        "kernel_used": bool(conv_kernels),
        "passed": error <= TOLERANCE[dtype_name],
    }


def served_check(device: str, dtype_name: str, folder: Path, log_path: Path) -> dict:
    """The worker on `device` answers a System One choice on the tiny LFM2, with /health naming the kernel."""
    from tests.fakes.net import free_port
    from tools.stack_run import spawn, stop_all, wait_healthy

    body = {
        "model": "lfm2.5-350m",
        "state": "Invoice 2231 was charged twice; the customer wants the money back.",
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team handles this?",
                "criteria": {"Billing": None, "Technical": None, "Sales": None},
            }
        },
    }
    answers, health = {}, {}
    for run_device, run_dtype in ((device, dtype_name), ("cpu", "float32")):
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JEV_")}
        env.update(
            PYTHONPATH=f"{REPO / 'services'}:{REPO}:{env.get('PYTHONPATH', '')}",
            JEV_RECIPE="lfm2.5-350m",
            JEV_MODEL_PATH=str(folder),
            JEV_DEVICE=run_device,
            JEV_DTYPE=run_dtype,
            JEV_REDIS_URL="",
            JEV_WORKER_HOST="127.0.0.1",
            JEV_WORKER_PORT=str(port),
            JEV_WORKER_REGISTER_TTL_S="0",
        )
        proc = spawn(f"worker-{run_device}", [sys.executable, "-m", "jev_worker"], env, REPO, log_path)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(proc, url + "/health", others=[], timeout_s=180, log=lambda line: None)
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                health[run_device] = json.load(response)["detail"]
            request = urllib.request.Request(
                url + "/v1/systemone", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                answers[run_device] = json.load(response)["answers"]["team"]["probabilities"]
        finally:
            stop_all([proc], log=lambda line: None)
    diff = max(abs(answers[device][k] - answers["cpu"][k]) for k in answers["cpu"])
    kernels = health[device].get("kernels", {})
    return {
        "kernels": kernels,
        "answers": answers,
        "max_abs_diff": diff,
        "passed": diff <= 0.05 and (device == "cpu" or bool(kernels.get("causal-conv1d", {}).get("used"))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "benchmarks" / "out" / "gpu"))
    parser.add_argument("--small", action="store_true", help="CPU dry run (LFM2 on PyTorch's fallback)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
    dtype_name = "bfloat16" if device == "cuda" else "float32"
    result: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        from importlib.metadata import version

        result["causal_conv1d"] = version("causal-conv1d")
    except Exception:  # noqa: BLE001 - not installed
        result["causal_conv1d"] = None
    if device == "cpu" and not args.small:
        result["error"] = "no CUDA: nothing to check (use --small for the CPU dry run)"
    elif device == "cuda" and result["causal_conv1d"] is None:
        result["error"] = "causal-conv1d is not installed (carry its wheel: tools/causal_conv1d_wheel.sh)"
    else:
        if device == "cuda":
            result["kernel"] = kernel_checks(device)
        from tools.tiny_lfm2_checkpoint import make_tiny_lfm2

        with tempfile.TemporaryDirectory() as tmp:
            folder = make_tiny_lfm2(Path(tmp) / "lfm2", seed=7)
            result["lfm2_forward"] = lfm2_forward_check(device, dtype_name, folder)
            result["served"] = served_check(device, dtype_name, folder, out / "gpu_conv_worker.log")
    checks = [*result.get("kernel", []), result.get("lfm2_forward"), result.get("served")]
    failed = [c for c in checks if c is not None and not c["passed"]]
    if device == "cuda" and "lfm2_forward" in result and not result["lfm2_forward"]["kernel_used"]:
        failed.append({"what": "the LFM2 forward on CUDA launched no causal-conv1d kernel"})
    result["passed"] = "error" not in result and not failed
    (out / "gpu_conv.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    lines = [
        f"# causal-conv1d on {result['device']} (torch {result['torch']}, causal-conv1d {result['causal_conv1d']})",
        "",
    ]
    if "error" in result:
        lines.append(f"**{result['error']}**")
    for row in result.get("kernel", []):
        step = "-" if row["update_rel_error"] is None else f"{row['update_rel_error']:.2e}"
        lines.append(
            f"- kernel {row['dtype']} {row['shape']} w={row['width']} bias={row['bias']} "
            f"act={row['activation']}: rel error {row['rel_error']:.2e}, update {step} "
            f"{'ok' if row['passed'] else 'FAILED'}"
        )
    if "lfm2_forward" in result:
        f = result["lfm2_forward"]
        lines.append(
            f"- LFM2 forward vs CPU FP32: rel error {f['rel_error']:.2e} (tolerance {f['tolerance']:g}); "
            f"conv kernels launched: {', '.join(f['conv_kernels']) or 'none (PyTorch fallback)'}"
        )
    if "served" in result:
        s = result["served"]
        lines.append(f"- served: /health kernels {s['kernels']}; max |dp| vs CPU {s['max_abs_diff']:.4f}")
    lines.append(f"\n{'PASSED' if result['passed'] else 'FAILED'}")
    (out / "gpu_conv.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines), flush=True)
    if "error" in result:
        return 3
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
