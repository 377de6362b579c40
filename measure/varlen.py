"""Packed variable-length batches: the measure stage's inputs and check for them.

A varlen call packs every sequence's rows one after another (``[total, heads, D]``) and says
where each starts with cumulative offsets (``cu_seqlens``, int32, ``batch + 1`` entries), as
FlashAttention-2's varlen forward takes them. Its launch is the loader's in packed mode
(:meth:`measure.loader.LoadedKernel.bind_config` with :attr:`VarlenInputs.packed`, the
kernels' arguments from :func:`measure.params.packed_params`); this module makes the inputs.

The check reuses the dense rule (:func:`measure.verify.check_output`) one sequence at a time:
each sequence's rows are a ``[1, len, heads, D]`` view of the packed tensors, with its own
float32 reference and SDPA yardstick. torch is imported when used.

A variant (:mod:`core.variant`) applies to every sequence with its own lengths (windows and
chunks bottom-right aligned per sequence); a sinks variant's logits (one per query head) are
drawn once per batch and shared by every sequence, as a call passes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.problem import Problem
from core.variant import PLAIN, Variant
from measure.params import PackedSeqs
from measure.reference import (
    InputSet,
    fresh_seed,
    make_sinks,
    measure_yardstick,
    reference_for_pairs,
    softmax_scale,
    torch_dtype,
)
from measure.verify import CheckResult, check_output

if TYPE_CHECKING:
    import torch

    from core.family import AnyConfig
    from measure.loader import BoundLaunch, ChainedLaunch, LoadedKernel


#: Longest sequence and most sequences a varlen call takes (int32 offsets, grid z).
MAX_TOTAL_ROWS = 2**31 - 1


def check_seqlens(seqlens_q: Sequence[int], seqlens_k: Sequence[int]) -> None:
    """Refuse length lists a varlen call cannot take, with a message naming the entry.

    Raises:
        ValueError: empty lists, lists of different lengths, a length below 1, or a total past
            int32.
    """
    if not seqlens_q:
        raise ValueError("a varlen batch needs at least one sequence")
    if len(seqlens_q) != len(seqlens_k):
        raise ValueError(
            f"{len(seqlens_q)} query lengths but {len(seqlens_k)} key lengths "
            "(one of each per sequence)"
        )
    for name, lens in (("query", seqlens_q), ("key", seqlens_k)):
        for i, n in enumerate(lens):
            if int(n) < 1:
                raise ValueError(f"sequence {i}: {name} length {n} (must be at least 1)")
        if sum(int(n) for n in lens) > MAX_TOTAL_ROWS:
            raise ValueError(f"{name} lengths add up past {MAX_TOTAL_ROWS} rows")


def cu_seqlens(lengths: Sequence[int]) -> list[int]:
    """Cumulative offsets ``[0, l0, l0 + l1, ...]`` of ``lengths``."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return out


@dataclass
class VarlenInputs:
    """One packed batch: tensors, offsets, and a dense :class:`InputSet` view per sequence.

    Attributes:
        q: ``[total_q, heads, D]``; k, v: ``[total_k, kv_heads, D]``.
        cu_q, cu_k: int32 offsets on the device, ``batch + 1`` entries each.
        sequences: per sequence, an InputSet whose tensors are views of q, k, v (its
            reference and SDPA yardstick were computed on exactly those rows).
        variant: the attention variant of every sequence.
        sinks: a sinks variant's ``[heads]`` float32 logits, else None.
    """

    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    heads: int
    kv_heads: int
    d: int
    dtype: str
    causal: bool
    scale: float
    seed: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    sequences: list[InputSet] = field(default_factory=list)
    variant: Variant = PLAIN
    sinks: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def offsets_q(self) -> list[int]:
        return cu_seqlens(self.seqlens_q)

    @property
    def total_q(self) -> int:
        return sum(self.seqlens_q)

    @property
    def flops(self) -> float:
        """Forward FLOPs summed over sequences (4·H·Nq·Nk·D each, halved for causal)."""
        pairs = zip(self.seqlens_q, self.seqlens_k, strict=True)
        f = sum(4.0 * self.heads * nq * nk * self.d for nq, nk in pairs)
        return f / 2 if self.causal else f

    @property
    def packed(self) -> PackedSeqs:
        """The sequences as a packed launch takes them (the offsets' device pointers)."""
        return PackedSeqs(self.cu_q.data_ptr(), self.cu_k.data_ptr(), self.batch,
                          max(self.seqlens_q), max(self.seqlens_k))  # fmt: skip

    def bind(
        self,
        kernel: LoadedKernel,
        config: AnyConfig,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        stream_handle: int,
    ) -> BoundLaunch | ChainedLaunch:
        """One launch of the varlen ``config`` on these inputs writing ``o`` (and ``lse``):
        :meth:`~measure.loader.LoadedKernel.bind_config` in its packed mode.

        Raises:
            ValueError: ``config`` is not a varlen config, or see
                :func:`measure.params.packed_params` and the family's ``host_prep``.
        """
        return kernel.bind_config(config, self.q, self.k, self.v, o, lse, self.scale, "bnhd",
                                  stream_handle, packed=self.packed, variant=self.variant,
                                  sinks=self.sinks)  # fmt: skip

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh O (like q) and LSE ``[heads, total_q]`` float32 buffers."""
        import torch

        o = torch.empty_like(self.q)
        lse = torch.empty((self.heads, self.total_q), dtype=torch.float32, device=self.q.device)
        return o, lse


def make_varlen_inputs(
    seqlens_q: Sequence[int],
    seqlens_k: Sequence[int] | None = None,
    *,
    heads: int,
    kv_heads: int | None = None,
    d: int,
    dtype: str = "fp16",
    causal: bool = False,
    device: Any = None,
    seed: int | None = None,
    reference: bool = True,
    sdpa_ref: bool = True,
    variant: Variant = PLAIN,
) -> VarlenInputs:
    """Standard-normal packed inputs; with ``reference``, each sequence's float32 reference
    (and, with ``sdpa_ref``, SDPA's error on it as the yardstick; a variant's: see
    :func:`measure.reference.measure_yardstick`). A sinks variant's logits are drawn once.

    Raises:
        ValueError: see :func:`check_seqlens`; heads not a multiple of kv heads.
    """
    import torch

    lens_q = tuple(int(n) for n in seqlens_q)
    lens_k = lens_q if seqlens_k is None else tuple(int(n) for n in seqlens_k)
    check_seqlens(lens_q, lens_k)
    hkv = heads if kv_heads is None else kv_heads
    if hkv < 1 or heads % hkv != 0:
        raise ValueError(f"heads {heads} is not a multiple of kv heads {hkv}")
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    tdt = torch_dtype(dtype)
    q = torch.randn((sum(lens_q), heads, d), generator=gen, dtype=tdt, device=dev)
    k = torch.randn((sum(lens_k), hkv, d), generator=gen, dtype=tdt, device=dev)
    v = torch.randn((sum(lens_k), hkv, d), generator=gen, dtype=tdt, device=dev)
    cu_q = torch.tensor(cu_seqlens(lens_q), dtype=torch.int32, device=dev)
    cu_k = torch.tensor(cu_seqlens(lens_k), dtype=torch.int32, device=dev)
    sinks = make_sinks(heads, seed, dev) if variant.sinks else None
    inputs = VarlenInputs(
        lens_q, lens_k, heads, hkv, d, dtype, causal, softmax_scale(d), seed, q, k, v, cu_q, cu_k,
        variant=variant, sinks=sinks,
    )  # fmt: skip
    if reference:
        inputs.sequences = [sequence_inputs(inputs, i, sdpa_ref) for i in range(len(lens_q))]
    return inputs


def sequence_inputs(inputs: VarlenInputs, i: int, sdpa_ref: bool) -> InputSet:
    """Sequence ``i`` as a dense B=1 InputSet over views of the packed tensors."""
    oq, ok = cu_seqlens(inputs.seqlens_q), cu_seqlens(inputs.seqlens_k)
    q = inputs.q[oq[i] : oq[i + 1]].unsqueeze(0)
    k = inputs.k[ok[i] : ok[i + 1]].unsqueeze(0)
    v = inputs.v[ok[i] : ok[i + 1]].unsqueeze(0)
    nq, nk = inputs.seqlens_q[i], inputs.seqlens_k[i]
    problem = Problem(
        gpu="varlen", d=inputs.d, n=nq, nk=nk if nk != nq else None, batch=1,
        heads=inputs.heads, kv_heads=inputs.kv_heads if inputs.kv_heads != inputs.heads else None,
        dtype=inputs.dtype, causal=inputs.causal, variant=inputs.variant,  # type: ignore[arg-type]
    )  # fmt: skip
    pairs = tuple((0, h) for h in range(inputs.heads))
    ref_o, ref_lse = reference_for_pairs(
        q, k, v, pairs, layout="bnhd", causal=inputs.causal, scale=inputs.scale,
        variant=inputs.variant, sinks=inputs.sinks,
    )  # fmt: skip
    seq = InputSet(problem, "bnhd", inputs.seed, inputs.scale, q, k, v, pairs, ref_o, ref_lse,
                   sinks=inputs.sinks)  # fmt: skip
    seq.ref_absmax = float(ref_o.abs().max()) if ref_o.numel() else 0.0
    if sdpa_ref:
        measure_yardstick(seq)
    return seq


def check_varlen(o: torch.Tensor, lse: torch.Tensor | None, inputs: VarlenInputs) -> CheckResult:
    """The dense rule on every sequence; the first failing one is named.

    Raises:
        ValueError: when ``inputs`` were made without references.
    """
    if len(inputs.sequences) != inputs.batch:
        raise ValueError("these inputs were made without references (reference=False)")
    offsets = inputs.offsets_q
    worst = (0.0, 0.0)
    for i, seq in enumerate(inputs.sequences):
        s, e = offsets[i], offsets[i + 1]
        seq_lse = None if lse is None else lse[:, s:e].unsqueeze(0)
        got = check_output(o[s:e].unsqueeze(0), seq_lse, seq)
        if not got.ok:
            where = f"sequence {i} (nq={seq.problem.n}, nk={seq.problem.n_keys}): "
            return got._replace(message=where + got.message)
        worst = (max(worst[0], got.max_abs_err), max(worst[1], got.rel_err))
    max_abs, rel = worst
    msg = f"{inputs.batch} sequences, max |O - ref| = {max_abs:.3e}"
    return CheckResult(True, max_abs, rel if math.isfinite(rel) else math.nan, msg)
