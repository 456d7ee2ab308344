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


def test_the_clipper_clips_as_accelerate_does_with_the_parameter_list_made_once():
    """GradClipper (issue 29) gives the gradients accelerate's clip_grad_norm_ gives, bit for bit, including
    parameters without a gradient (frozen); tensor-subclass parameters (DTensor) keep accelerate's own call."""
    import torch
    from accelerate import Accelerator

    from accel_train.models import create_model
    from accel_train.optim import GradClipper

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = create_model("lenet", 10, 1, 28)
    next(model.parameters()).requires_grad_(False)  # a frozen layer: no gradient to clip
    grads = []
    for clip in (lambda: acc.clip_grad_norm_(model.parameters(), 0.05), GradClipper(acc, model, 0.05)):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        torch.nn.functional.cross_entropy(model(torch.randn(8, 1, 28, 28)), torch.randint(0, 10, (8,))).backward()
        before = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        clip()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(before) == len(list(model.parameters())) - 1
    clipped = any(not torch.equal(a, b) for a, b in zip(before, grads[0], strict=True))
    assert clipped, "the norm must be over 0.05: clipped"
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))

    class Sub(torch.Tensor):  # a tensor subclass parameter, as DTensor is
        pass

    odd = torch.nn.Linear(2, 2)
    odd.weight = torch.nn.Parameter(odd.weight.detach().as_subclass(Sub))
    assert GradClipper(acc, odd, 1.0).params is None
    assert GradClipper(acc, model, 1.0).params is not None


def test_the_step_calls_backward_itself_only_where_accelerate_would_add_nothing():
    """direct_backward (issue 29): one micro-batch per optimizer step, no fp16 scaler, no DeepSpeed; with
    accumulation accelerate's backward divides the loss and accumulate() decides the sync step: kept."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from accel_train.optim import direct_backward

    def acc(**kw):
        base = dict(gradient_accumulation_steps=1, scaler=None, distributed_type=DistributedType.NO, sync_gradients=1)
        return SimpleNamespace(**{**base, **kw})

    assert direct_backward(acc(), 1)
    assert direct_backward(acc(distributed_type=DistributedType.MULTI_GPU), 1)
    assert not direct_backward(acc(), 2)
    assert not direct_backward(acc(gradient_accumulation_steps=4), 1)
    assert not direct_backward(acc(scaler=object()), 1)
    assert not direct_backward(acc(distributed_type=DistributedType.DEEPSPEED), 1)
