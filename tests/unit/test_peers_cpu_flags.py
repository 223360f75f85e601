"""llama.cpp's build flags for the peer benchmark follow the CPU (benchmarks/peers/cpu_flags.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "cpu_flags.py"
spec = importlib.util.spec_from_file_location("cpu_flags", PATH)
cpu_flags = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_flags)

EPYC_AVX2 = "flags\t\t: fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 sha_ni vaes"
XEON_AMX = EPYC_AVX2 + " avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 avx512_vbmi amx_tile amx_int8"


def args(cpuinfo: str) -> dict[str, str]:
    out = cpu_flags.cmake_args(cpu_flags.cpu_flags(cpuinfo))
    return dict(item.removeprefix("-D").split("=") for item in out.split())


def test_an_avx2_cpu_gets_no_avx512():
    got = args("processor\t: 0\n" + EPYC_AVX2 + "\n")
    assert got["GGML_AVX2"] == got["GGML_FMA"] == got["GGML_F16C"] == "ON"
    assert got["GGML_AVX512"] == got["GGML_AVX512_VNNI"] == got["GGML_AVX512_BF16"] == "OFF"


def test_an_avx512_cpu_keeps_it_but_never_native_or_amx():
    got = args(XEON_AMX)
    assert got["GGML_AVX512"] == got["GGML_AVX512_VNNI"] == got["GGML_AVX512_BF16"] == "ON"
    assert got["GGML_NATIVE"] == got["GGML_AMX_TILE"] == got["GGML_AMX_INT8"] == got["GGML_AMX_BF16"] == "OFF"
