"""The llama.cpp build flags for the CPU this runs on (benchmarks/peers/install.sh).

Never GGML_NATIVE (a native build on these VMs once crashed in AMX tile code the hypervisor does not allow),
never AMX; each x86 extension is on exactly when /proc/cpuinfo lists it, so a build on an AVX2-only EPYC
does not die with SIGILL in AVX-512 code, and one on an AVX-512 Xeon still uses it.

    python3 benchmarks/peers/cpu_flags.py     # prints the CMAKE_ARGS
"""

from __future__ import annotations

import sys

# cmake option -> the /proc/cpuinfo flags it needs (all of them)
OPTIONS = {
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "GGML_AVX512_VBMI": ("avx512f", "avx512_vbmi"),
    "GGML_AVX512_VNNI": ("avx512f", "avx512_vnni"),
    "GGML_AVX512_BF16": ("avx512f", "avx512_bf16"),
}
ALWAYS_OFF = ("GGML_NATIVE", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cmake_args(flags: set[str]) -> str:
    args = [f"-D{option}=OFF" for option in ALWAYS_OFF]
    args += [f"-D{option}={'ON' if all(f in flags for f in needs) else 'OFF'}" for option, needs in OPTIONS.items()]
    return " ".join(args)


def main() -> int:
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        print(cmake_args(cpu_flags(handle.read())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
