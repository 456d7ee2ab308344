"""Counter-based randomness: random numbers as a pure function of ``(seed, epoch, sample index, stream)``.

A draw is a hash of its key, not the next value of a generator, so it does not depend on what ran
before it: not on the number of processes, the order batches were fetched in, a resume in the middle
of an epoch, or other users of torch's RNG. Nothing here reads or advances the global RNG or any
``torch.Generator``.

The hash is integer arithmetic on ``int64`` tensors holding 32-bit values (Chris Wellons'
"lowbias32" mixer, chained over the key's parts), computed on the device the indices are on. Every
product stays below 2**49, so no operation overflows and the bits are identical on CPU and CUDA;
the conversions to float and the comparisons are exact, so ``keyed_uniform`` and friends agree
across devices too.

``stream`` separates independent uses (crop offsets, flips, mixup, dropout): an ``int``, or a name,
hashed with CRC-32 (the same in every process, unlike ``hash(str)``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import torch

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads small counters (0, 1, 2, ...) before mixing
_LOW16 = 0xFFFF


def _mul32(x, c: int):
    """``(x * c) mod 2**32`` for ``x`` in ``[0, 2**32)``: split ``c`` in 16-bit halves, nothing overflows int64."""
    return (x * (c & _LOW16) + (((x * (c >> 16)) & _LOW16) << 16)) & MASK32


def mix32(x):
    """A bijective 32-bit mixer (works on Python ints and on int64 tensors of values in ``[0, 2**32)``)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_id(stream: int | str) -> int:
    """A stream's 32-bit id: ints as given (mod 2**32), names by CRC-32."""
    return zlib.crc32(stream.encode()) if isinstance(stream, str) else int(stream) & MASK32


def _key(seed: int, epoch: int, stream: int | str) -> int:
    """The per-(seed, epoch, stream) key, in Python ints (64-bit seeds and epochs fold in both halves)."""
    h = mix32(_GOLDEN ^ stream_id(stream))
    for part in (seed, epoch):
        h = mix32(h ^ (int(part) & MASK32))
        h = mix32(h ^ ((int(part) >> 32) & MASK32))
    return h


def _as_indices(indices: torch.Tensor | Sequence[int]) -> torch.Tensor:
    idx = indices if isinstance(indices, torch.Tensor) else torch.as_tensor(indices, dtype=torch.int64)
    if idx.dtype != torch.int64:
        idx = idx.to(torch.int64)
    return idx.reshape(-1)


def keyed_bits(
    seed: int, epoch: int, indices: torch.Tensor | Sequence[int], count: int = 1, stream: int | str = 0
) -> torch.Tensor:
    """``count`` 32-bit random integers per sample: ``int64 [B, count]`` in ``[0, 2**32)``, on ``indices``' device.

    Sample ``i``'s values depend only on ``(seed, epoch, i, stream)``: the same whichever batch ``i``
    is in, on any device. Indices must be non-negative.
    """
    idx = _as_indices(indices)
    h = mix32((idx & MASK32) ^ _key(seed, epoch, stream))
    h = mix32(h ^ (idx >> 32))
    draws = mix32((torch.arange(count, dtype=torch.int64, device=idx.device) * _GOLDEN + 1) & MASK32)
    return mix32(h[:, None] ^ draws[None, :])


def keyed_uniform(
    seed: int,
    epoch: int,
    indices: torch.Tensor | Sequence[int],
    count: int = 1,
    stream: int | str = 0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Uniform floats in ``[0, 1)``: ``[B, count]``, as many random bits as ``dtype`` holds exactly (24 in float32)."""
    used = min(32, 1 - round(math.log2(torch.finfo(dtype).eps)))  # the significand's bits
    bits = keyed_bits(seed, epoch, indices, count, stream) >> (32 - used)
    return bits.to(dtype) * (2.0**-used)


def keyed_randint(
    seed: int, epoch: int, indices: torch.Tensor | Sequence[int], high: int, count: int = 1, stream: int | str = 0
) -> torch.Tensor:
    """Integers in ``[0, high)``: ``int64 [B, count]`` (``high`` at most 2**31; Lemire's multiply-shift)."""
    if not 1 <= high <= 2**31:
        raise ValueError(f"high must be in [1, 2**31], got {high}")
    return (keyed_bits(seed, epoch, indices, count, stream) * high) >> 32


def keyed_bernoulli(
    seed: int, epoch: int, indices: torch.Tensor | Sequence[int], p: float, count: int = 1, stream: int | str = 0
) -> torch.Tensor:
    """``True`` with probability ``p`` (to 2**-32): ``bool [B, count]`` (dropout masks, flips)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return keyed_bits(seed, epoch, indices, count, stream) < round(p * 2**32)
