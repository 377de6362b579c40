"""The kernels' by-value argument, :class:`FaParams`, and building it from torch tensors.

Every kernel family's kernels take one ``FaParams`` first (the ABI of
``docs/architecture.md``): the Q, K, V, O and LSE pointers, the (batch, head, row) strides of
Q, K, V and O in elements, the sizes and the softmax scale. :func:`make_params` checks the
tensors in either layout (:data:`LAYOUTS`: ``bnhd`` or ``bhnd``) and fills one in.

A packed variable-length launch (a ``_vl`` config) is the same launch in its packed mode: the
tensors are ``[total, heads, D]``, :class:`PackedSeqs` describes the sequences (offsets on
the device, the longest lengths), and :func:`packed_params` makes the ``FaParams`` (the
packed tensors seen as one batch of ``total`` rows, batch strides 0, ``batch`` the number of
sequences) and the :class:`FaVarlen` the kernels take second.

A config built with an attention-variant switch (``config.has_variant``) takes a
:class:`FaVariant` last: the run-time window, chunk, softcap and the sinks' device pointer,
built by :func:`variant_params` from the call's :class:`~core.variant.Variant` (normalised
with the call's lengths, as :func:`core.variant.normalize` says).

Contract: the struct's size, alignment and field offsets are asserted at import, so a drifting
field list fails on any machine, not on the GPU; :func:`make_params` refuses (``ValueError``)
every tensor set the kernels cannot take (shape, dtype, device, a non-contiguous head
dimension, a stride not a multiple of :data:`ALIGN_ELEMS` elements, a pointer not
:data:`ALIGN_BYTES`-aligned). torch is not imported at module import time; loading and
launching are :mod:`measure.loader`'s.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from core.elements import ELEMENTS
from core.variant import Variant, normalize

if TYPE_CHECKING:
    import torch

Layout = Literal["bnhd", "bhnd"]
LAYOUTS: tuple[Layout, ...] = ("bnhd", "bhnd")

#: Pointers and strides must allow 16-byte vector copies: 8 two-byte elements.
ALIGN_ELEMS = 8
ALIGN_BYTES = 16


class FaParams(ctypes.Structure):
    """The kernel's single by-value argument; layout as in ``docs/architecture.md``."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("q_batch_stride", ctypes.c_int64),
        ("q_head_stride", ctypes.c_int64),
        ("q_row_stride", ctypes.c_int64),
        ("k_batch_stride", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("k_row_stride", ctypes.c_int64),
        ("v_batch_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
        ("v_row_stride", ctypes.c_int64),
        ("o_batch_stride", ctypes.c_int64),
        ("o_head_stride", ctypes.c_int64),
        ("o_row_stride", ctypes.c_int64),
        ("batch", ctypes.c_int32),
        ("q_heads", ctypes.c_int32),
        ("kv_heads", ctypes.c_int32),
        ("nq", ctypes.c_int32),
        ("nk", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
    ]


# The ABI is fixed; a drifting field list must fail at import, not on the GPU.
assert ctypes.sizeof(FaParams) == 160, ctypes.sizeof(FaParams)
assert ctypes.alignment(FaParams) == 8
assert FaParams.softmax_scale.offset == 156
assert FaParams.batch.offset == 136


def _dims(t: torch.Tensor, layout: Layout) -> tuple[int, int, int, int]:
    """(batch, rows, heads, head_dim) of a 4-d tensor in ``layout``."""
    if layout == "bnhd":
        b, n, h, d = t.shape
    else:
        b, h, n, d = t.shape
    return int(b), int(n), int(h), int(d)


def _strides(t: torch.Tensor, layout: Layout) -> tuple[int, int, int]:
    """(batch, head, row) strides in elements."""
    s = t.stride()
    if layout == "bnhd":
        return s[0], s[2], s[1]
    return s[0], s[1], s[2]


def _check_tensor(name: str, t: torch.Tensor, layout: Layout) -> None:
    if t.dim() != 4:
        raise ValueError(
            f"{name} must be 4-d [{'B, N, H, D' if layout == 'bnhd' else 'B, H, N, D'}]"
        )
    if t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the head dimension must be contiguous (stride 1), got {t.stride()}"
        )
    # The head dim (last) is contiguous; the other strides step whole rows of vectors.
    for dim, (size, stride) in enumerate(zip(t.shape[:-1], t.stride()[:-1], strict=True)):
        # A size-1 dimension's stride is never multiplied by a non-zero index.
        if size > 1 and stride % ALIGN_ELEMS != 0:
            raise ValueError(
                f"{name}: stride {stride} of dim {dim} is not a multiple of {ALIGN_ELEMS} "
                f"elements (16-byte vector copies); strides {tuple(t.stride())}"
            )
    if t.data_ptr() % ALIGN_BYTES != 0:
        raise ValueError(f"{name}: data pointer {t.data_ptr():#x} is not 16-byte aligned")


def make_params(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    scale: float,
    layout: Layout = "bnhd",
) -> FaParams:
    """Build the kernel argument from torch tensors.

    Args:
        q: queries, ``[B, Nq, Hq, D]`` (``bnhd``) or ``[B, Hq, Nq, D]`` (``bhnd``).
        k: keys, ``[B, Nk, Hkv, D]`` or ``[B, Hkv, Nk, D]``; ``Hq % Hkv == 0``.
        v: values, same shape as ``k``.
        o: output, same shape as ``q``.
        lse: ``[B, Hq, Nq]`` contiguous float32, or ``None`` (null pointer: not written).
        scale: softmax scale (usually ``1/sqrt(D)``).
        layout: ``"bnhd"`` or ``"bhnd"``; any strides work as long as D is contiguous.

    Raises:
        ValueError: on shape, dtype or device mismatches, a non-contiguous head dimension, a
            stride that is not a multiple of 8 elements or a pointer not 16-byte aligned.
    """
    import torch

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    named = {"q": q, "k": k, "v": v, "o": o}
    for name, t in named.items():
        _check_tensor(name, t, layout)
    dtypes = {t.dtype for t in named.values()}
    supported = {getattr(torch, e.torch_name) for e in ELEMENTS.values()}
    if len(dtypes) != 1 or q.dtype not in supported:
        raise ValueError(f"q, k, v, o must share one dtype, float16 or bfloat16; got {dtypes}")
    devices = {t.device for t in named.values()} | ({lse.device} if lse is not None else set())
    if len(devices) != 1 or q.device.type != "cuda":
        raise ValueError(f"all tensors must be on one CUDA device; got {devices}")
    b, nq, hq, d = _dims(q, layout)
    bk, nk, hkv, dk = _dims(k, layout)
    if tuple(o.shape) != tuple(q.shape):
        raise ValueError(f"o shape {tuple(o.shape)} != q shape {tuple(q.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v shape {tuple(v.shape)} != k shape {tuple(k.shape)}")
    if bk != b or dk != d:
        raise ValueError(f"k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)}")
    if hkv < 1 or hq % hkv != 0:
        raise ValueError(f"q heads {hq} is not a multiple of kv heads {hkv}")
    if nq < 1 or nk < 1:
        raise ValueError(f"empty sequence: nq={nq}, nk={nk}")
    if lse is not None and (
        lse.dtype != torch.float32 or tuple(lse.shape) != (b, hq, nq) or not lse.is_contiguous()
    ):
        raise ValueError(
            f"lse must be a contiguous float32 [B, Hq, Nq] = {(b, hq, nq)} tensor, "
            f"got {lse.dtype} {tuple(lse.shape)} strides {lse.stride()}"
        )
    if max(b, hq, hkv, nq, nk) >= 2**31:
        raise ValueError("dimensions must fit in int32")
    qs, ks, vs, os_ = (_strides(t, layout) for t in (q, k, v, o))
    return FaParams(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        o.data_ptr(),
        lse.data_ptr() if lse is not None else None,
        *qs,
        *ks,
        *vs,
        *os_,
        b,
        hq,
        hkv,
        nq,
        nk,
        float(scale),
    )


class FaVarlen(ctypes.Structure):
    """The varlen kernels' second argument (``codegen/templates/fa_params.cuh``)."""

    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


assert ctypes.sizeof(FaVarlen) == 24 and ctypes.alignment(FaVarlen) == 8


@dataclass(frozen=True)
class PackedSeqs:
    """A packed launch's sequences, as the kernels take them beside the packed tensors.

    Attributes:
        cu_seqlens_q, cu_seqlens_k: device pointers to the int32 offsets (``count + 1``
            entries each; sequence ``i``'s rows are ``[cu[i], cu[i + 1])``).
        count: number of sequences.
        max_seqlen_q, max_seqlen_k: the longest lengths (the grid covers ``max_seqlen_q``
            rows per sequence).
    """

    cu_seqlens_q: int
    cu_seqlens_k: int
    count: int
    max_seqlen_q: int
    max_seqlen_k: int

    def part(self, first: int, count: int) -> PackedSeqs:
        """Sequences ``first .. first + count - 1``: the same offset arrays from a later entry
        (offsets are absolute row numbers)."""
        return PackedSeqs(self.cu_seqlens_q + 4 * first, self.cu_seqlens_k + 4 * first, count,
                          self.max_seqlen_q, self.max_seqlen_k)  # fmt: skip


def packed_params(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    scale: float,
    seqs: PackedSeqs,
) -> tuple[FaParams, FaVarlen]:
    """The two kernel arguments of a packed launch.

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_k, Hkv, D]``; o: like q.
        lse: contiguous float32 ``[Hq, total_q]``, or None (not written).
        scale: softmax scale.
        seqs: the sequences.

    Raises:
        ValueError: o not shaped like q; lse not a contiguous float32 ``[Hq, total_q]``;
            anything :func:`make_params` refuses of the packed tensors seen as one batch.
    """
    import torch

    if tuple(o.shape) != tuple(q.shape):
        raise ValueError(f"o shape {tuple(o.shape)} != q shape {tuple(q.shape)}")
    total_q = int(q.shape[0])
    want = (int(q.shape[1]), total_q)
    if lse is not None and (
        lse.dtype != torch.float32 or tuple(lse.shape) != want or not lse.is_contiguous()
    ):
        raise ValueError(f"lse must be a contiguous float32 [heads, total_q] = {want} tensor")
    params = make_params(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), o.unsqueeze(0), None, scale, "bnhd"
    )
    params.lse = lse.data_ptr() if lse is not None else None
    params.batch = seqs.count
    params.nq, params.nk = seqs.max_seqlen_q, seqs.max_seqlen_k
    for name in ("q", "k", "v", "o"):
        setattr(params, f"{name}_batch_stride", 0)
    return params, FaVarlen(seqs.cu_seqlens_q, seqs.cu_seqlens_k, total_q, 0)


class FaVariant(ctypes.Structure):
    """The variant kernels' last argument (``codegen/templates/fa_params.cuh``): window bounds
    (-1: none; a causal call's right is 0), chunk (0: none), softcap (0: none) and the sinks'
    ``[q_heads]`` float32 device pointer (null: none)."""

    _fields_ = [
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("chunk", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("sinks", ctypes.c_void_p),
    ]


# The C struct's static_asserts, mirrored: a drift fails here, on any machine.
assert ctypes.sizeof(FaVariant) == 24 and ctypes.alignment(FaVariant) == 8
assert FaVariant.window_right.offset == 4 and FaVariant.chunk.offset == 8
assert FaVariant.softcap.offset == 12 and FaVariant.sinks.offset == 16


def launch_variant(
    causal: bool, variant: Variant, nq: int | None = None, nk: int | None = None
) -> Variant:
    """The window a kernel is given for ``variant`` on a call of ``nq`` queries and ``nk`` keys:
    :func:`core.variant.normalize`'s form, and a causal call's right bound 0 always (the
    kernels' local mask takes causality as that bound; normalising plain causal to "no
    window" is the store's form, not the kernel's). A call that normalising makes causal
    (a window ``(-1, 0)``) keeps that right bound 0 too, whatever the config's mask.

    Lengths left ``None`` normalise nothing that depends on them (a packed batch, whose
    sequences each have their own lengths).
    """
    now_causal, norm = normalize(
        causal, variant.window_left, variant.window_right, variant.chunk,
        nq=nq, nk=nk, softcap=variant.softcap, sinks=variant.sinks,
    )  # fmt: skip
    # normalize() may call a (-1, 0) window causal: a config built without the causal mask
    # then gets that bound as its window, or it would compute full attention.
    if (causal or now_causal) and norm.window_right != 0:
        norm = Variant(norm.window_left, 0, norm.chunk, norm.softcap, norm.sinks)
    return norm


def variant_params(
    variant: Variant,
    sinks: torch.Tensor | None,
    *,
    causal: bool,
    nq: int | None = None,
    nk: int | None = None,
    q_heads: int | None = None,
) -> FaVariant:
    """The :class:`FaVariant` of one launch.

    Args:
        variant: the call's variant (as the problem states it; normalised here).
        sinks: with ``variant.sinks``, the per-query-head logits: a contiguous float32
            ``[q_heads]`` tensor on the launch's device; else ``None``.
        causal: the config's mask.
        nq, nk: the call's lengths (``None`` for a packed batch).
        q_heads: the call's query heads (checks ``sinks``' length when given).

    Raises:
        ValueError: sinks missing for a sinks variant, given for one without, or not a
            contiguous float32 CUDA tensor of ``q_heads`` entries.
    """
    if variant.sinks != (sinks is not None):
        raise ValueError(
            "a sinks variant needs the sinks tensor" if variant.sinks
            else "a sinks tensor was given for a variant without sinks"
        )  # fmt: skip
    ptr = None
    if sinks is not None:
        import torch  # only a sinks tensor needs it: a plain or windowed launch builds without

        if (
            sinks.dtype != torch.float32
            or sinks.dim() != 1
            or not sinks.is_contiguous()
            or sinks.device.type != "cuda"
            or (q_heads is not None and int(sinks.shape[0]) != q_heads)
        ):
            raise ValueError(
                f"sinks must be a contiguous float32 CUDA tensor [q_heads = {q_heads}], got "
                f"{sinks.dtype} {tuple(sinks.shape)} on {sinks.device}"
            )
        ptr = sinks.data_ptr()
    w = launch_variant(causal, variant, nq, nk)
    return FaVariant(w.window_left, w.window_right, w.chunk, float(w.softcap), ptr)


class FaKvCache(ctypes.Structure):
    """A KV-cache kernel's last argument (``codegen/templates/fa_params.cuh``): device
    pointers to each sequence's cached length, the batch-to-cache-row map and the block
    table, the table's row stride, the keys this call appended, and each sequence's first key
    in a left-padded contiguous cache (null: 0)."""

    _fields_ = [
        ("seqlens", ctypes.c_void_p),
        ("batch_idx", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p),
        ("table_stride", ctypes.c_int32),
        ("added", ctypes.c_int32),
        ("leftpad", ctypes.c_void_p),
    ]


assert ctypes.sizeof(FaKvCache) == 40 and ctypes.alignment(FaKvCache) == 8
assert FaKvCache.table_stride.offset == 24 and FaKvCache.added.offset == 28
assert FaKvCache.leftpad.offset == 32


def cache_params(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    scale: float,
    capacity: int,
) -> FaParams:
    """The :class:`FaParams` of a KV-cache launch: ``q`` and ``o`` ``[B, Nq, Hq, D]``, the
    caches ``[rows, capacity, Hkv, D]`` (contiguous: rows of the cache, the batch stride
    the cache row's) or ``[pages, page size, Hkv, D]`` (paged: the batch stride is the page
    stride); ``nk`` is the ``capacity`` (the most keys a sequence can have).

    Raises:
        ValueError: as :func:`make_params` for the tensors' strides, alignment, dtypes and
            devices, or caches whose heads or head dim do not match ``q``.
    """
    import torch

    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("o", o)):
        _check_tensor(name, t, "bnhd")
    dtypes = {t.dtype for t in (q, k_cache, v_cache, o)}
    supported = {getattr(torch, e.torch_name) for e in ELEMENTS.values()}
    if len(dtypes) != 1 or q.dtype not in supported:
        raise ValueError(f"q, the caches and o must share one dtype, fp16 or bf16; got {dtypes}")
    devices = {t.device for t in (q, k_cache, v_cache, o)}
    if len(devices) != 1 or q.device.type != "cuda":
        raise ValueError(f"all tensors must be on one CUDA device; got {devices}")
    b, nq, hq, d = _dims(q, "bnhd")
    _, _, hkv, dk = _dims(k_cache, "bnhd")
    if tuple(v_cache.shape) != tuple(k_cache.shape) or dk != d or hkv < 1 or hq % hkv:
        raise ValueError(
            f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not match q "
            f"{tuple(q.shape)}"
        )
    if max(b, hq, nq, capacity) >= 2**31:
        raise ValueError("dimensions must fit in int32")
    qs, ks, vs, os_ = (_strides(t, "bnhd") for t in (q, k_cache, v_cache, o))
    return FaParams(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(),
        lse.data_ptr() if lse is not None else None,
        *qs, *ks, *vs, *os_, b, hq, hkv, nq, capacity, float(scale),
    )  # fmt: skip


class FaKvAppend(ctypes.Structure):
    """A cache kernel's append argument (``codegen/templates/kv_append.cuh``): the new keys'
    and values' pointers and strides (elements), rows per sequence, the page size (0:
    contiguous) and 16-byte chunks per row."""

    _fields_ = [
        ("k_new", ctypes.c_void_p),
        ("v_new", ctypes.c_void_p),
        ("k_batch_stride", ctypes.c_int64),
        ("k_row_stride", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("v_batch_stride", ctypes.c_int64),
        ("v_row_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
        ("rows", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("chunks", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


assert ctypes.sizeof(FaKvAppend) == 80 and ctypes.alignment(FaKvAppend) == 8
assert FaKvAppend.rows.offset == 64 and FaKvAppend.chunks.offset == 72


def append_params(k: torch.Tensor, v: torch.Tensor, page_size: int) -> FaKvAppend:
    """The :class:`FaKvAppend` of new rows ``k``/``v`` ``[B, Nnew, Hkv, D]`` (pointers filled
    in; the caller patches them per call).

    Raises:
        ValueError: a head dimension that is not contiguous, a stride not a multiple of 8
            elements or a pointer not 16-byte aligned (the kernel copies 16-byte chunks).
    """
    for name, t in (("k", k), ("v", v)):
        _check_tensor(name, t, "bnhd")
    ks, vs = _strides(k, "bnhd"), _strides(v, "bnhd")
    # _strides gives (batch, head, row); FaKvAppend wants (batch, row, head)
    return FaKvAppend(
        k.data_ptr(), v.data_ptr(), ks[0], ks[2], ks[1], vs[0], vs[2], vs[1],
        int(k.shape[1]), page_size, int(k.shape[-1]) * k.element_size() // 16, 0,
    )  # fmt: skip
