"""Whether the CPU has bfloat16 units, read from /proc/cpuinfo text."""

from cropscale.env.host import cpu_bf16_units

AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"


def test_flags_decide():
    assert cpu_bf16_units(AVX2) is False
    assert cpu_bf16_units(SAPPHIRE) is True
    assert cpu_bf16_units("Processor\t: ARMv8\nFeatures\t: fp asimd\n") is None  # no flags line: unknown


def test_reads_this_machine():
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        assert cpu_bf16_units() is None
        return
    expected = (" avx512_bf16" in text or " amx_bf16" in text) if "flags" in text else None
    assert cpu_bf16_units() == expected
