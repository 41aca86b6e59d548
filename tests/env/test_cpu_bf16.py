"""Whether the CPU has bfloat16 units, read from /proc/cpuinfo text."""

import platform
from pathlib import Path

import pytest
import torch

from cropscale.env.host import cpu_bf16_units

AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"


def test_flags_decide():
    assert cpu_bf16_units(AVX2) is False
    assert cpu_bf16_units(SAPPHIRE) is True
    assert cpu_bf16_units("Processor\t: ARMv8\nFeatures\t: fp asimd\n") is None  # no flags line: unknown


def test_reads_this_machine_as_cpuid_does():
    """/proc/cpuinfo's flags against an independent reading: CPUID through torch's cpuinfo library."""
    cpuid = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if platform.machine().lower() not in ("x86_64", "amd64") or cpuid is None or not Path("/proc/cpuinfo").is_file():
        pytest.skip("needs an x86 Linux host and torch.cpu._is_avx512_bf16_supported")
    assert cpu_bf16_units() is bool(cpuid())
