"""Issue 12 (speed): what the run knows about this CPU, and per-step work that is done once."""

from __future__ import annotations

from accel_train.runtime import BF16_ON_CPU, bf16_cpu_note, cpu_bf16_kind

AMX = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
AVX = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 avx512_vnni\n"
OLD = "processor\t: 0\nflags\t\t: fpu sse avx2\n"


def test_cpu_kind_is_read_from_the_kernel_flags():
    assert cpu_bf16_kind(AMX) == "amx"
    assert cpu_bf16_kind(AVX) == "avx512_bf16"
    assert cpu_bf16_kind(OLD) == "none"
    assert cpu_bf16_kind("") == "unknown"
    assert cpu_bf16_kind() in BF16_ON_CPU  # this machine, whatever it is


def test_bf16_note_only_for_bf16_on_cpu():
    assert bf16_cpu_note("no", "cpu") is None
    assert bf16_cpu_note("bf16", "cuda") is None
    assert "faster" in bf16_cpu_note("bf16", "cpu", "amx")
    assert "either way" in bf16_cpu_note("bf16", "cpu", "avx512_bf16")
    assert "slower than fp32" in bf16_cpu_note("bf16", "cpu", "none")


def test_package_lookups_in_the_optimizer_step_are_cached():
    import accelerate.optimizer

    from accel_train.runtime import _cache_per_step_package_lookups

    _cache_per_step_package_lookups()
    _cache_per_step_package_lookups()  # idempotent: not a cache of a cache
    check = accelerate.optimizer.is_lomo_available
    assert hasattr(check, "cache_info") and not hasattr(check.__wrapped__, "cache_info")
    check()
    before = check.cache_info().hits
    check()
    assert check.cache_info().hits == before + 1
