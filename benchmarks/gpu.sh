#!/usr/bin/env bash
# One GPU check + benchmark call (at most ~8 minutes), writing everything under $OUT.
#
#   bash benchmarks/gpu.sh            # on the CUDA machine, from the repository root
#   bash benchmarks/gpu.sh --small    # CPU dry run of the same script (tiny model), e.g. here
#
# Installs nothing from the network. If Python packages the worker needs are missing on the machine
# (pydantic, redis, ...), put their wheels in benchmarks/wheels/ (or .whl/) and carry that folder:
# they are installed from there with --no-index into /tmp/jev-site. causal-conv1d compiled for the
# machine's own torch (tools/causal_conv1d_wheel.sh, into .cache/wheels/gpu/) is carried the same way
# and checked first (benchmarks/gpu_conv.py: kernel vs reference, LFM2's conv path served through it). Extra arguments go to
# benchmarks/gpu_check.py. Exit status: gpu_check's (0 ok, 1 a check failed, 3 no CUDA / missing
# packages), 124 when it ran past its time limit; when gpu_check passed but gpu_conv (run where causal-conv1d is
# installed) failed, gpu_conv's (1, or 124; its 3, no CUDA to check, is not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/benchmarks/out/gpu}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
LIMIT_S="${JEV_GPU_CHECK_LIMIT_S:-450}"
: >"$LOG"
say() { echo "[gpu.sh] $*" | tee -a "$LOG"; }

# A venv if there is one that has torch, else the machine's python3.
PY=""
for candidate in .venv/bin/python python3 python; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
    PY="$candidate"; break
  fi
done
if [ -z "$PY" ]; then
  say "no python with torch found (.venv/bin/python, python3, python): nothing to run"
  printf '# GPU check\n\nNo Python with torch on this machine; nothing was measured.\n' >"$OUT/gpu_report.md"
  exit 3
fi
say "python: $(command -v "$PY") ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"

wheels=$(ls benchmarks/wheels/*.whl .whl/*.whl .cache/wheels/gpu/*.whl 2>/dev/null || true)
if [ -n "$wheels" ]; then
  say "installing carried wheels (no index): $(echo $wheels | wc -w) files"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/jev-site \
    $wheels >>"$LOG" 2>&1 || say "wheel install failed (see the log); continuing with what is there"
  export PYTHONPATH="/tmp/jev-site${PYTHONPATH:+:$PYTHONPATH}"
fi

cuda=$("$PY" -c "import torch; print(torch.cuda.is_available())" 2>>"$LOG")
say "torch.cuda.is_available(): $cuda"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>&1 | sed 's/^/[gpu.sh] nvidia-smi: /' | tee -a "$LOG"

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
conv_rc=0
if "$PY" -c "import importlib.metadata as m; m.version('causal-conv1d')" >/dev/null 2>&1; then
  timeout --kill-after=10 "${JEV_GPU_CONV_LIMIT_S:-150}" "$PY" -m benchmarks.gpu_conv --out "$OUT" 2>&1 | tee -a "$LOG"
  conv_rc=${PIPESTATUS[0]}
  say "gpu_conv exit status $conv_rc"
fi
timeout --kill-after=15 "$LIMIT_S" "$PY" -m benchmarks.gpu_check --out "$OUT" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
say "gpu_check exit status $rc; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
# a part that ran and failed fails the call; gpu_conv's 3 says it could not apply here (no CUDA), not a failure
if [ "$rc" -eq 0 ] && [ "$conv_rc" -ne 0 ] && [ "$conv_rc" -ne 3 ]; then
  say "gpu_conv failed: exit status $conv_rc"
  rc=$conv_rc
fi
exit "$rc"
