"""Inputs and the float32 reference a kernel's output is checked against.

One :class:`InputSet` per (problem, layout) is built once and reused for every config of a
problem: random inputs from a fresh seed, a float32 reference for a bounded subset of
(batch, head) pairs, and the error torch SDPA (flash backend, else efficient) makes on the
same inputs — the yardstick of the error budget (see :mod:`measure.verify`).

Semantics the reference fixes (and the kernel must match):

* ``S = scale * Q K^T`` with ``scale = 1/sqrt(D)``, ``O = softmax(S) V``, ``LSE = ln sum exp S``.
* Causal masks are bottom-right aligned: key ``j`` is visible to query ``i`` iff
  ``j <= i + nk - nq`` (FlashAttention-2 convention; the usual lower triangle when nq == nk).
* GQA: query head ``h`` uses kv head ``h // (Hq / Hkv)``, i.e. the kv heads
  ``repeat_interleave``-d up to ``Hq``.
* Rows that see no key (causal with nq > nk: the first ``nq - nk`` rows) have ``O = 0`` and
  ``LSE = -inf``.
* Variants (:mod:`core.variant`, FlashAttention's rules, bottom-right aligned with
  ``pos = i + nk - nq``): a window keeps keys ``pos - left <= j <= pos + right`` (-1: no
  bound), a chunk keeps the keys of ``pos``'s chunk, both on top of causality; softcap turns
  each scaled score ``s`` into ``cap * tanh(s / cap)``; sinks add ``exp(sink[h])`` (one fp32
  logit per query head) to every row's denominator, so ``LSE`` includes it and a row that
  sees no key has ``O = 0`` and ``LSE = sink[h]``. Rows that see no key are always leading
  rows (:func:`dead_row_count`). torch SDPA computes none of these, so a variant's yardstick
  is the reference itself rounded as a kernel rounds (:func:`emulated_error`).

Only torch is needed (any device); the module imports without it.
"""

from __future__ import annotations

import logging
import math
import secrets
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from core.elements import ELEMENTS
from core.problem import Problem
from core.variant import PLAIN, Variant
from measure.params import LAYOUTS, Layout

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SDPA_BACKENDS: tuple[str, ...] = ("flash", "efficient", "cudnn")
_SDPA_ENUM = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
#: The reference covers every (batch, head) pair while its work, B*Hq*Nq*Nk*D multiply-adds
#: in each of its two products, stays at or under this: 2^45, once per problem and shared by
#: all its configs. Every problem the shipped H200 results hold fits; the largest, Mistral-7B's
#: B=4 Hq=32 N=32k D=128 with its window (2^44), took 13.6 s on an H200 with its emulated
#: yardstick, B=16 Hq=32 N=8k 1.8 s (bench/reference_cost.py,
#: docs/measurements/2026-12-02-reference-cost/).
#: Above it, as many pairs as the budget covers (at least :data:`MIN_PAIRS`).
FULL_CHECK_WORK = 2**45
#: The reference's output (pairs x Nq x D float32) stays under this many bytes.
REFERENCE_BYTES = 4 << 30
#: Pairs checked at least where the budget covers fewer: the first, the last and one between.
MIN_PAIRS = 3
#: Working memory of one reference chunk (scores and probabilities of a block of rows).
CHUNK_BYTES = 256 << 20


class SdpaUnsupported(RuntimeError):
    """torch SDPA cannot run this case with the requested backend; the message says why."""


class PairErrors(NamedTuple):
    """Output error against the reference over the checked pairs' live rows.

    Attributes:
        max_abs: largest ``|out - ref|`` (``inf`` when a checked value is not finite).
        rel: ``||out - ref||_2 / ||ref||_2`` over the checked elements.
        worst: (batch, head, row, col) of the largest error.
        finite: every checked output value is finite.
    """

    max_abs: float
    rel: float
    worst: tuple[int, int, int, int]
    finite: bool


def softmax_scale(d: int) -> float:
    """The softmax scale for head dimension ``d``: ``1 / sqrt(d)``."""
    return 1.0 / math.sqrt(d)


def dead_row_count(nq: int, nk: int, causal: bool, variant: Variant = PLAIN) -> int:
    """Leading query rows that see no key.

    Only rows whose key position ``pos = i + nk - nq`` is negative can see none (any other
    row sees key ``pos`` itself: every window and chunk keeps it), so they lead. Such a row
    sees nothing when a right bound (causal: 0, or ``window_right``) stops it before key 0,
    or under a chunk (``pos``'s chunk then lies before key 0); with neither it sees keys.
    """
    if nq <= nk:
        return 0
    if variant.chunk > 0:
        return nq - nk
    rights = ([0] if causal else []) + ([variant.window_right] if variant.window_right >= 0 else [])
    if not rights:
        return 0
    return max(0, nq - nk - min(rights))


def hidden_keys(
    rows: torch.Tensor, cols: torch.Tensor, nq: int, nk: int, causal: bool, variant: Variant
) -> torch.Tensor | None:
    """Where query ``rows`` (``[R, 1]``) do not see keys ``cols`` (``[1, nk]``): a ``[R, nk]``
    bool mask, True where hidden; None when every row sees every key."""
    import torch

    pos = rows + (nk - nq)
    parts: list[torch.Tensor] = []
    if causal:
        parts.append(cols > pos)
    if variant.window_left >= 0:
        parts.append(cols < pos - variant.window_left)
    if variant.window_right >= 0:
        parts.append(cols > pos + variant.window_right)
    if variant.chunk > 0:
        start = pos - torch.remainder(pos, variant.chunk)  # rounds down for negative pos too
        parts.append((cols < start) | (cols >= start + variant.chunk))
    if not parts:
        return None
    hide = parts[0]
    for part in parts[1:]:
        hide = hide | part
    return hide


#: Offset of the sinks' generator seed from the inputs' (the sinks are their own draw).
SINKS_SEED_OFFSET = 0x5EED5


def make_sinks(heads: int, seed: int, device: Any) -> torch.Tensor:
    """Random sink logits, one per query head: ``2 * N(0, 1)`` in float32, drawn from the
    input seed (offset), so a recorded seed reproduces them. The spread covers sinks far
    below a row's scores (no effect) and far above (rows dominated by the sink)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed((seed + SINKS_SEED_OFFSET) % 2**63)
    return torch.randn((heads,), generator=gen, dtype=torch.float32, device=device) * 2.0


def fresh_seed() -> int:
    """A new random seed (63 bits) for one input set; recorded for reproduction."""
    return secrets.randbits(63)


def torch_dtype(name: str) -> torch.dtype:
    """``"fp16"``/``"bf16"`` as a torch dtype."""
    import torch

    if name not in ELEMENTS:
        raise ValueError(f"unsupported dtype {name!r}")
    dtype: torch.dtype = getattr(torch, ELEMENTS[name].torch_name)
    return dtype


def as_bhnd(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """A ``[B, H, N, D]`` view of a tensor stored in ``layout``."""
    return t.permute(0, 2, 1, 3) if layout == "bnhd" else t


def empty_in_layout(
    b: int, n: int, h: int, d: int, layout: Layout, dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """An uninitialised contiguous tensor of logical size (b, n, h, d) stored in ``layout``."""
    import torch

    shape = (b, n, h, d) if layout == "bnhd" else (b, h, n, d)
    return torch.empty(shape, dtype=dtype, device=device)


def choose_pairs(
    problem: Problem,
    *,
    min_pairs: int = MIN_PAIRS,
    full_limit: int = FULL_CHECK_WORK,
    seed: int = 0,
) -> tuple[tuple[int, int], ...]:
    """(batch, q_head) pairs whose output is compared against the reference.

    Every pair while B*Hq*Nq*Nk*D is at most ``full_limit`` (and their reference fits
    :data:`REFERENCE_BYTES`); otherwise as many as those bounds cover, at least
    ``min_pairs``: the first and the last (they catch batch and head stride errors at both
    ends) and pseudo-random ones in between.
    """
    b, h = problem.batch, problem.heads
    every = [(bi, hi) for bi in range(b) for hi in range(h)]
    per_pair = problem.n * problem.n_keys * problem.d
    fits = min(full_limit // per_pair, REFERENCE_BYTES // (4 * problem.n * problem.d))
    count = max(min_pairs, fits)
    if count >= len(every):
        return tuple(every)
    picks = [every[0], every[-1]]
    rng = seed
    while len(picks) < count:
        rng = (rng * 6364136223846793005 + 1442695040888963407) % 2**64
        cand = every[rng % len(every)]
        if cand not in picks:
            picks.append(cand)
    return tuple(sorted(picks[:count]))


@contextmanager
def exact_fp32_matmul() -> Iterator[None]:
    """Disable TF32 for float32 matmuls while the reference is computed."""
    import torch

    mm = torch.backends.cuda.matmul
    if hasattr(mm, "fp32_precision"):  # torch >= 2.9; the old flag is deprecated there
        old_p = mm.fp32_precision
        mm.fp32_precision = "ieee"
        try:
            yield
        finally:
            mm.fp32_precision = old_p
    else:
        old_f = mm.allow_tf32
        mm.allow_tf32 = False
        try:
            yield
        finally:
            mm.allow_tf32 = old_f


def reference_for_pairs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pairs: tuple[tuple[int, int], ...],
    *,
    layout: Layout,
    causal: bool,
    scale: float,
    chunk_bytes: int = CHUNK_BYTES,
    variant: Variant = PLAIN,
    sinks: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 attention output and LSE for the given (batch, q_head) pairs.

    Rows are processed in chunks so the score matrix of a chunk stays under ``chunk_bytes``.
    Each pair is computed on its own (its q head, its kv head, its sink): exact for every
    pair it covers, whichever pairs those are.

    ``variant`` masks and caps the scores (module docstring); ``sinks`` (``[Hq]`` float32,
    required with ``variant.sinks``) join the denominators. ``round_to`` (a dtype) computes
    the kernel-like approximation instead (:func:`emulated_error`): probabilities rounded to
    it before the product with V, and softcapped scores rounded to fp16 (``tanh.approx``'s
    relative error, 2^-11, is one fp16 rounding).

    Raises:
        ValueError: a sinks variant without ``sinks``.

    Returns:
        ``(ref_o, ref_lse)`` of shapes ``[P, Nq, D]`` and ``[P, Nq]``, float32.
    """
    import torch

    qb, kb, vb = as_bhnd(q, layout), as_bhnd(k, layout), as_bhnd(v, layout)
    hq, nq, d = qb.shape[1], qb.shape[2], qb.shape[3]
    hkv, nk = kb.shape[1], kb.shape[2]
    group = hq // hkv
    dev = q.device
    ref_o = torch.empty((len(pairs), nq, d), dtype=torch.float32, device=dev)
    ref_lse = torch.empty((len(pairs), nq), dtype=torch.float32, device=dev)
    if variant.sinks and sinks is None:
        raise ValueError("a sinks variant's reference needs the sinks")
    if variant.plain and sinks is None and round_to is None:
        _plain_reference(qb, kb, vb, pairs, ref_o, ref_lse, causal, scale, chunk_bytes)
        return ref_o, ref_lse
    # Scores, probabilities and a few masks of a chunk: about four fp32 rows of nk each.
    rows_per_chunk = max(1, chunk_bytes // (16 * nk))
    cols = torch.arange(nk, device=dev)[None, :]
    cap = variant.softcap
    with exact_fp32_matmul():
        for p, (bi, hi) in enumerate(pairs):
            kh = hi // group  # == repeat_interleave(group) of the kv heads
            kt = kb[bi, kh].float()
            vt = vb[bi, kh].float()
            for r0 in range(0, nq, rows_per_chunk):
                r1 = min(nq, r0 + rows_per_chunk)
                s = (qb[bi, hi, r0:r1].float() @ kt.T) * scale
                if cap > 0:
                    s = torch.tanh(s / cap) * cap
                    if round_to is not None:
                        s = s.half().float()
                rows = torch.arange(r0, r1, device=dev)[:, None]
                hide = hidden_keys(rows, cols, nq, nk, causal, variant)
                if hide is not None:
                    s.masked_fill_(hide, float("-inf"))
                lse = torch.logsumexp(s, dim=-1)  # -inf where a row sees no key
                if sinks is not None:
                    lse = torch.logaddexp(lse, sinks[hi].float())  # the sink's own term
                live = torch.isfinite(lse)
                prob = torch.exp(s - torch.where(live, lse, 0.0)[:, None])
                prob = torch.where(live[:, None], prob, 0.0)
                if round_to is not None:
                    prob = prob.to(round_to).float()
                ref_o[p, r0:r1] = prob @ vt
                ref_lse[p, r0:r1] = lse
    return ref_o, ref_lse


def _plain_reference(
    qb: torch.Tensor,
    kb: torch.Tensor,
    vb: torch.Tensor,
    pairs: tuple[tuple[int, int], ...],
    ref_o: torch.Tensor,
    ref_lse: torch.Tensor,
    causal: bool,
    scale: float,
    chunk_bytes: int,
) -> None:
    """Plain attention's reference, the computation it always was (its figures stay bit for
    bit what stored measurements were checked against)."""
    import torch

    hq, nq = qb.shape[1], qb.shape[2]
    hkv, nk = kb.shape[1], kb.shape[2]
    group = hq // hkv
    dev = qb.device
    # Scores, probabilities and the mask of a chunk: about three fp32 rows of nk each.
    rows_per_chunk = max(1, chunk_bytes // (12 * nk))
    cols = torch.arange(nk, device=dev)
    with exact_fp32_matmul():
        for p, (bi, hi) in enumerate(pairs):
            kh = hi // group  # == repeat_interleave(group) of the kv heads
            kt = kb[bi, kh].float()
            vt = vb[bi, kh].float()
            for r0 in range(0, nq, rows_per_chunk):
                r1 = min(nq, r0 + rows_per_chunk)
                s = (qb[bi, hi, r0:r1].float() @ kt.T) * scale
                if causal:
                    rows = torch.arange(r0, r1, device=dev)[:, None]
                    s.masked_fill_(cols[None, :] > rows + (nk - nq), float("-inf"))
                lse = torch.logsumexp(s, dim=-1)  # -inf where a row sees no key
                live = torch.isfinite(lse)
                prob = torch.exp(s - torch.where(live, lse, 0.0)[:, None])
                prob = torch.where(live[:, None], prob, 0.0)
                ref_o[p, r0:r1] = prob @ vt
                ref_lse[p, r0:r1] = lse


def _warning_text(caught: list[warnings.WarningMessage], limit: int = 3) -> str:
    msgs: list[str] = []
    for w in caught:
        text = " ".join(str(w.message).split())
        if text and text not in msgs:
            msgs.append(text[:200])
    return "; ".join(msgs[:limit])


def sdpa_callable(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    backend: str,
) -> tuple[Callable[[], torch.Tensor], str]:
    """A zero-argument call of torch SDPA restricted to one backend, probed once.

    Args:
        q: ``[B, Hq, Nq, D]`` (any strides with D contiguous).
        k: ``[B, Hkv, Nk, D]``.
        v: ``[B, Hkv, Nk, D]``.
        causal: bottom-right aligned causal mask.
        scale: softmax scale.
        backend: ``"flash"``, ``"efficient"``, ``"cudnn"`` or ``"math"``.

    Returns:
        ``(fn, note)``: ``fn()`` returns ``[B, Hq, Nq, D]``; ``note`` says how the case was
        mapped (e.g. kv heads expanded for GQA), empty when directly.

    Raises:
        SdpaUnsupported: with torch's reasons when the backend cannot run the case.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend not in _SDPA_ENUM:
        raise ValueError(f"unknown SDPA backend {backend!r}; one of {tuple(_SDPA_ENUM)}")
    nq, nk = q.shape[2], k.shape[2]
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv

    def expanded() -> tuple[torch.Tensor, torch.Tensor]:
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    if causal and nq != nk:
        # torch's public is_causal is top-left aligned; its bottom-right CausalBias picks the
        # backend itself, so the bottom-right ops are called directly, as that bias does.
        kk, vv = expanded() if group > 1 else (k, v)
        note = "bottom-right causal via aten op" + (", kv heads expanded" if group > 1 else "")
        if backend == "flash":

            def flash_lr() -> torch.Tensor:
                out = torch.ops.aten._scaled_dot_product_flash_attention(
                    q, kk, vv, 0.0, True, False, scale=scale
                )
                return out[0]

            fn: Callable[[], torch.Tensor] = flash_lr
        elif backend == "efficient":

            def efficient_lr() -> torch.Tensor:
                out = torch.ops.aten._efficient_attention_forward(
                    q.transpose(1, 2),
                    kk.transpose(1, 2),
                    vv.transpose(1, 2),
                    bias=None,
                    cu_seqlens_q=None,
                    cu_seqlens_k=None,
                    max_seqlen_q=None,
                    max_seqlen_k=None,
                    dropout_p=0.0,
                    custom_mask_type=2,  # CausalVariant.LOWER_RIGHT
                    compute_log_sumexp=False,
                    scale=scale,
                )
                return out[0].transpose(1, 2)

            fn = efficient_lr
        else:
            raise SdpaUnsupported(
                f"bottom-right causal with nq != nk has no {backend} path in torch's API"
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except (RuntimeError, TypeError, ValueError, AttributeError) as exc:
            raise SdpaUnsupported(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        return fn, note

    be = getattr(SDPBackend, _SDPA_ENUM[backend])
    variants: list[tuple[str, Callable[[], tuple[torch.Tensor, torch.Tensor]], dict[str, Any]]]
    if group > 1:
        variants = [
            ("native GQA", lambda: (k, v), {"enable_gqa": True}),
            ("kv heads expanded for GQA", expanded, {}),
        ]
    else:
        variants = [("", lambda: (k, v), {})]
    reasons: list[str] = []
    for note, kv, kwargs in variants:
        kk, vv = kv()

        def call(kk: torch.Tensor = kk, vv: torch.Tensor = vv, kw: Any = kwargs) -> torch.Tensor:
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(
                    q, kk, vv, is_causal=causal, scale=scale, **kw
                )

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call()
            except (RuntimeError, TypeError, ValueError) as exc:
                why = _warning_text(caught) or " ".join(str(exc).split())[:300]
                reasons.append(f"{note}: {why}" if note else why)
                continue
        return call, note
    raise SdpaUnsupported("; ".join(reasons) or "no kernel available")


def errors_vs_reference(
    out: torch.Tensor, inputs: InputSet, layout: Layout | None = None
) -> PairErrors:
    """Compare ``out`` with the reference on the checked pairs.

    Args:
        out: output stored in ``layout`` (``inputs.layout`` when ``None``).
        inputs: the input set whose reference is compared against.
        layout: storage of ``out``.

    Only rows that see at least one key (of their batch row's: :meth:`InputSet.dead_rows_of`)
    are compared; dead rows are checked by :func:`measure.verify.check_output` separately.
    """
    import torch

    ob = as_bhnd(out, layout or inputs.layout)
    max_abs = -1.0
    worst = (0, 0, 0, 0)
    sq_err = 0.0
    sq_ref = 0.0
    for p, (bi, hi) in enumerate(inputs.pairs):
        dead = inputs.dead_rows_of(bi)
        o = ob[bi, hi, dead:].float()
        r = inputs.ref_o[p, dead:]
        bad = ~torch.isfinite(o)
        if bool(bad.any()):
            row, col = bad.nonzero()[0].tolist()
            return PairErrors(math.inf, math.inf, (bi, hi, row + dead, col), False)
        diff = (o - r).abs()
        m = float(diff.max())
        if m > max_abs:
            idx = int(diff.argmax())
            max_abs = m
            worst = (bi, hi, idx // diff.shape[1] + dead, idx % diff.shape[1])
        sq_err += float((diff.double() ** 2).sum())
        sq_ref += float((r.double() ** 2).sum())
    rel = math.sqrt(sq_err / sq_ref) if sq_ref > 0 else math.sqrt(sq_err)
    return PairErrors(max(max_abs, 0.0), rel, worst, True)


@dataclass(eq=False)
class InputSet:
    """Inputs of one problem in one layout, the reference on them and SDPA's error on them.

    Attributes:
        problem: the problem.
        layout: how q, k, v and the output are stored (``"bnhd"`` or ``"bhnd"``).
        seed: the torch.Generator seed the inputs were drawn with.
        scale: softmax scale used by the reference and passed to kernels.
        q: queries in ``layout``.
        k: keys.
        v: values.
        pairs: (batch, q_head) pairs the reference covers.
        ref_o: float32 ``[len(pairs), Nq, D]``.
        ref_lse: float32 ``[len(pairs), Nq]``.
        ref_err: SDPA's max abs error against the reference (None when no SDPA backend ran).
        ref_backend: which SDPA backend ``ref_err`` comes from.
        ref_note: why no SDPA yardstick is available, or how the case was mapped.
        ref_absmax: largest ``|ref_o|`` (sets the rounding part of the tolerance).
        sinks: with a sinks variant, its ``[Hq]`` float32 logits (:func:`make_sinks`), the
            ones the reference used and the kernel is given; else None.
        key_lengths: the keys each batch row's reference saw, its first ``L_b`` (a KV-cache
            problem of mixed lengths: :func:`measure.kvcache.cache_inputset`); None: every
            row the problem's ``nk``. Rows see no key per batch row then
            (:meth:`dead_rows_of`).
    """

    problem: Problem
    layout: Layout
    seed: int
    scale: float
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    pairs: tuple[tuple[int, int], ...]
    ref_o: torch.Tensor
    ref_lse: torch.Tensor
    ref_err: float | None = None
    ref_backend: str | None = None
    ref_note: str = ""
    ref_absmax: float = 0.0
    sinks: torch.Tensor | None = None
    key_lengths: tuple[int, ...] | None = None
    _outputs: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def dead_rows(self) -> int:
        """Leading query rows that see no key in every batch row."""
        p = self.problem
        if self.key_lengths is None:
            return dead_row_count(p.n, p.n_keys, p.causal, p.variant)
        return min(self.dead_rows_of(bi) for bi in range(p.batch))

    def dead_rows_of(self, batch: int) -> int:
        """Leading query rows of batch row ``batch`` that see no key (its own key count)."""
        p = self.problem
        nk = p.n_keys if self.key_lengths is None else self.key_lengths[batch]
        return dead_row_count(p.n, nk, p.causal, p.variant)

    def dead_spans(self) -> list[tuple[int, int, int]]:
        """``(start, stop, dead)``: runs of batch rows whose leading ``dead`` rows see no key,
        in order, together covering the batch (one run unless :attr:`key_lengths` is set)."""
        b = self.problem.batch
        if self.key_lengths is None:
            return [(0, b, self.dead_rows)]
        spans: list[tuple[int, int, int]] = []
        for bi in range(b):
            dead = self.dead_rows_of(bi)
            if spans and spans[-1][2] == dead:
                spans[-1] = (spans[-1][0], bi + 1, dead)
            else:
                spans.append((bi, bi + 1, dead))
        return spans

    def bhnd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as ``[B, H, N, D]`` views."""
        return (
            as_bhnd(self.q, self.layout),
            as_bhnd(self.k, self.layout),
            as_bhnd(self.v, self.layout),
        )

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Output buffers (O in ``layout``, LSE ``[B, Hq, Nq]`` float32), allocated once."""
        import torch

        if self._outputs is None:
            p = self.problem
            o = empty_in_layout(
                p.batch, p.n, p.heads, p.d, self.layout, self.q.dtype, self.q.device
            )
            lse = torch.empty((p.batch, p.heads, p.n), dtype=torch.float32, device=self.q.device)
            self._outputs = (o, lse)
        return self._outputs

    @property
    def nbytes(self) -> int:
        """Device memory held (inputs, reference and output buffers)."""
        ts = [self.q, self.k, self.v, self.ref_o, self.ref_lse, *(self._outputs or ())]
        ts += [] if self.sinks is None else [self.sinks]
        return sum(t.numel() * t.element_size() for t in ts)

    def describe(self) -> dict[str, object]:
        """JSON-able summary for a measurement's ``extra`` (``variant`` only when not plain)."""
        out: dict[str, object] = {
            "seed": self.seed,
            "layout": self.layout,
            "pairs_checked": len(self.pairs),
            "pairs_total": self.problem.batch * self.problem.heads,
            "ref_backend": self.ref_backend,
            "ref_note": self.ref_note,
        }
        if not self.problem.variant.plain:
            out["variant"] = self.problem.variant.describe()
        return out


def make_inputs(
    problem: Problem, layout: Layout, *, device: Any, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard-normal q, k, v in ``layout`` drawn from a generator seeded with ``seed``."""
    import torch

    dtype = torch_dtype(problem.dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    p = problem

    def draw(n: int, h: int) -> torch.Tensor:
        shape = (p.batch, n, h, p.d) if layout == "bnhd" else (p.batch, h, n, p.d)
        return torch.randn(shape, generator=gen, dtype=dtype, device=device)

    return draw(p.n, p.heads), draw(p.n_keys, p.n_kv_heads), draw(p.n_keys, p.n_kv_heads)


def make_inputset(
    problem: Problem,
    layout: Layout = "bnhd",
    *,
    device: Any = None,
    seed: int | None = None,
    min_pairs: int = MIN_PAIRS,
    full_limit: int = FULL_CHECK_WORK,
    sdpa_ref: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
) -> InputSet:
    """Draw inputs for ``problem``, compute the reference and SDPA's error on them.

    Args:
        problem: shape, dtype and mask.
        layout: storage of q, k, v and the output.
        device: torch device; the current CUDA device when ``None``.
        seed: generator seed; a fresh random one when ``None``.
        min_pairs: (batch, head) pairs the reference covers at least above ``full_limit``.
        full_limit: B*Hq*Nq*Nk*D up to which every pair is covered (:func:`choose_pairs`).
        sdpa_ref: also measure the yardstick: SDPA's error (flash backend, else efficient),
            or for a variant the kernel-like rounding's (:func:`emulated_error`).
        chunk_bytes: memory bound of one reference chunk.

    A sinks variant's logits are drawn once here (:func:`make_sinks`, from ``seed``).
    """
    import torch

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if problem.heads % problem.n_kv_heads != 0:
        raise ValueError(f"heads {problem.heads} not a multiple of kv heads {problem.n_kv_heads}")
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    seed = fresh_seed() if seed is None else seed
    q, k, v = make_inputs(problem, layout, device=dev, seed=seed)
    pairs = choose_pairs(problem, min_pairs=min_pairs, full_limit=full_limit, seed=seed)
    scale = softmax_scale(problem.d)
    variant = problem.variant
    sinks = make_sinks(problem.heads, seed, dev) if variant.sinks else None
    ref_o, ref_lse = reference_for_pairs(
        q, k, v, pairs, layout=layout, causal=problem.causal, scale=scale, chunk_bytes=chunk_bytes,
        variant=variant, sinks=sinks,
    )  # fmt: skip
    inputs = InputSet(problem, layout, seed, scale, q, k, v, pairs, ref_o, ref_lse, sinks=sinks)
    inputs.ref_absmax = float(ref_o.abs().max())
    if sdpa_ref:
        measure_yardstick(inputs)
    return inputs


def measure_yardstick(inputs: InputSet) -> None:
    """Fill ``ref_err``/``ref_backend``/``ref_note``: SDPA's error for plain attention
    (:func:`_measure_sdpa_error`), the kernel-like rounding's for a variant
    (:func:`emulated_error`), which SDPA does not compute."""
    if inputs.problem.variant.plain:
        _measure_sdpa_error(inputs)
        return
    inputs.ref_err = emulated_error(inputs)
    inputs.ref_backend = "emulated"
    inputs.ref_note = (
        "variant: no SDPA path; yardstick = the reference with probabilities rounded to "
        f"{inputs.problem.dtype}" + (" and capped scores to fp16" if inputs.problem.variant.softcap
                                     else "")
    )  # fmt: skip


def emulated_error(inputs: InputSet) -> float:
    """Max ``|O - ref|`` over the checked pairs' live rows of the reference computed as a
    kernel rounds (``reference_for_pairs(..., round_to=dtype)``): the error an honest kernel
    of the problem's dtype makes, standing in for SDPA's where SDPA cannot run the variant."""
    p = inputs.problem
    approx, _ = reference_for_pairs(
        inputs.q, inputs.k, inputs.v, inputs.pairs, layout=inputs.layout, causal=p.causal,
        scale=inputs.scale, variant=p.variant, sinks=inputs.sinks,
        round_to=torch_dtype(p.dtype),
    )  # fmt: skip
    dead = inputs.dead_rows
    diff = (approx[:, dead:] - inputs.ref_o[:, dead:]).abs()
    return float(diff.max()) if diff.numel() else 0.0


def _measure_sdpa_error(inputs: InputSet) -> None:
    """Fill ``ref_err``/``ref_backend`` from the first SDPA backend that runs the case."""
    qb, kb, vb = inputs.bhnd()
    notes: list[str] = []
    for backend in ("flash", "efficient"):
        try:
            fn, note = sdpa_callable(
                qb, kb, vb, causal=inputs.problem.causal, scale=inputs.scale, backend=backend
            )
            out = fn()
        except SdpaUnsupported as exc:
            notes.append(f"{backend}: {exc}")
            continue
        errs = errors_vs_reference(out, inputs, layout="bhnd")
        del out
        if not errs.finite:
            notes.append(f"{backend}: non-finite output")
            continue
        inputs.ref_err = errs.max_abs
        inputs.ref_backend = backend
        inputs.ref_note = note
        return
    inputs.ref_note = "; ".join(notes)
    log.info("no SDPA yardstick for %s: %s", inputs.problem.study_name, inputs.ref_note)
