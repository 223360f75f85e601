"""Make causal-conv1d's setup.py compile for TORCH_CUDA_ARCH_LIST only (used by images/cuda.Dockerfile).

causal-conv1d 1.7.0 hard-codes its -gencode list (sm_75 ... sm_120), and because its nvcc flags already
name architectures, torch's TORCH_CUDA_ARCH_LIST is ignored. This inserts, right before the ABI
block that follows the list, a replacement list built from TORCH_CUDA_ARCH_LIST ("9.0", "8.0;9.0",
"9.0a", "9.0+PTX"). It refuses to run when the anchor is missing, so a version bump fails loudly
instead of silently building every architecture.

    python images/causal_conv1d_arch.py path/to/setup.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ANCHOR = "    if FORCE_CXX11_ABI:\n"
MARKER = "# jev: gencode from TORCH_CUDA_ARCH_LIST"
PATCH = f"""    {MARKER}
    if not HIP_BUILD and os.getenv("TORCH_CUDA_ARCH_LIST"):
        cc_flag = []
        for _arch in os.environ["TORCH_CUDA_ARCH_LIST"].replace(",", ";").replace(" ", ";").split(";"):
            _arch = _arch.strip()
            if not _arch:
                continue
            _ptx = _arch.endswith("+PTX")
            _num = _arch.removesuffix("+PTX").replace(".", "")
            cc_flag += ["-gencode", f"arch=compute_{{_num}},code=sm_{{_num}}"]
            if _ptx:
                cc_flag += ["-gencode", f"arch=compute_{{_num}},code=compute_{{_num}}"]
        print("jev: causal-conv1d gencode flags", cc_flag)

"""


def patch(text: str) -> str:
    if MARKER in text:
        return text
    if text.count(ANCHOR) != 1 or "cc_flag" not in text:
        raise SystemExit("causal_conv1d_arch: anchor not found once in setup.py; update the patch for this version")
    return text.replace(ANCHOR, PATCH + ANCHOR)


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    path.write_text(patch(path.read_text()))
    print(f"causal_conv1d_arch: patched {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
