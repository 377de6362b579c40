"""TMA descriptors for the Hopper family's launches (the ``fa3`` family's ``host_prep``).

An fa3 kernel (docs/fa3_kernel.md) takes, after its :class:`~measure.params.FaParams`, three
``__grid_constant__ CUtensorMap`` arguments by value: the tiled TMA descriptors of Q, K and V.
A descriptor holds the tensor's global address, so it is built per launch (per bound launch:
a timing loop reuses one) from the tensors' pointers, shapes and strides, with
``cuTensorMapEncodeTiled`` through cuda-bindings:

* rank 4, dimensions ``(D, N, H, B)`` innermost first, byte strides ``(row, head, batch)`` read
  from the tensor, so ``[B, N, H, D]``, ``[B, H, N, D]`` and padded strides all work (a
  dimension of extent 1 is never stepped over and gets a synthetic 16-byte-multiple stride);
* box ``(64, rows, 1, 1)``: 64 columns = one 128-byte swizzle row of 2-byte elements, rows
  ``block_m`` for Q and ``block_n`` for K and V; a row of D columns takes ``ceil(D / 64)``
  boxes (the kernel issues one per 64 columns);
* fp16 / bf16, interleave none, ``CU_TENSOR_MAP_SWIZZLE_128B``, L2 promotion 256 B, and
  out-of-bounds elements filled with zeros (``CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE``: the tails
  past N, and D = 96's second half box, read as 0).

The descriptors are returned as :class:`TensorMap` values (ctypes, the 128 opaque bytes), so
the loader packs them into ``cuLaunchKernel``'s argument array like the params struct and
they outlive the cuda-bindings objects they were copied from.

Packed variable-length launches (``_vl`` configs, :func:`fa3_varlen_tensor_maps`) take the
same descriptors over the packed ``[total, heads, D]`` tensors seen as one batch of ``total``
rows, dimensions ``(D, total, H, 1)``: the kernel adds each sequence's offset to the row
coordinate, and rows past the tensor's end read as zeros.

Neither torch nor cuda-bindings is imported at module import time.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from codegen.cuda_driver import call, driver
from core.fa3_config import BOX_COLS, Fa3Config
from core.family import AnyConfig

if TYPE_CHECKING:
    import torch

#: Bytes of one ``CUtensorMap`` (``CU_TENSOR_MAP_NUM_QWORDS`` = 16).
TENSOR_MAP_BYTES = 128
#: TMA's alignment of a global address and of every global stride (bytes).
ALIGN_BYTES = 16
#: TMA's limit on a global stride (bytes): below 2^40.
MAX_STRIDE = 1 << 40


class TensorMap(ctypes.Structure):
    """The 128 opaque bytes of one ``CUtensorMap``, as a kernel argument.

    The device-side parameter is 64-byte aligned; the driver copies the argument's bytes into
    the parameter space at each launch, so the host copy needs no particular alignment.
    """

    _fields_ = [("opaque", ctypes.c_uint64 * (TENSOR_MAP_BYTES // 8))]


assert ctypes.sizeof(TensorMap) == TENSOR_MAP_BYTES


def dims_and_strides(
    shape: tuple[int, ...], strides: tuple[int, ...], element_bytes: int, layout: str
) -> tuple[list[int], list[int]]:
    """TMA dimensions ``(D, N, H, B)`` and byte strides ``(row, head, batch)`` of a tensor.

    Args:
        shape: the 4-d shape, ``[B, N, H, D]`` (``bnhd``) or ``[B, H, N, D]`` (``bhnd``).
        strides: its strides in elements (D's must be 1; not checked here).
        element_bytes: bytes per element.
        layout: ``"bnhd"`` or ``"bhnd"``.

    A dimension of extent 1 (or a zero / negative stride) is never stepped over; it gets the
    stride a dense tensor would have, rounded up to 16 bytes, which TMA accepts.
    """
    if layout == "bnhd":
        b, n, h, d = shape
        sb, sn, sh, _ = strides
    else:
        b, h, n, d = shape
        sb, sh, sn, _ = strides
    es = int(element_bytes)
    dims = [int(d), int(n), int(h), int(b)]
    byte_strides = [int(sn) * es, int(sh) * es, int(sb) * es]
    for i, size in enumerate(dims[1:]):
        if size == 1 or byte_strides[i] <= 0:
            dense = dims[0] * es if i == 0 else dims[i] * byte_strides[i - 1]
            byte_strides[i] = max(16, -(-dense // 16) * 16)
    return dims, byte_strides


def encode_tensor_map(t: torch.Tensor, layout: str, box_rows: int) -> TensorMap:
    """The 4-d tiled TMA descriptor of ``t``: box ``(64, box_rows, 1, 1)``, 128-byte swizzle.

    Raises:
        ValueError: when ``t`` is not 4-d fp16/bf16 with a contiguous head dim, or its pointer
            or byte strides are not 16-byte multiples, or a stride is 2^40 bytes or more
            (TMA's rules).
        CudaError: when the driver rejects the descriptor.
    """
    import torch

    cu = driver()
    kinds = {
        torch.float16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        torch.bfloat16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    }
    if t.dim() != 4 or t.stride(-1) != 1:
        raise ValueError(f"TMA needs a 4-d tensor with a contiguous head dim, strides {t.stride()}")
    if t.dtype not in kinds:
        raise ValueError(f"TMA descriptors here are fp16/bf16, got {t.dtype}")
    dims, strides = dims_and_strides(tuple(t.shape), tuple(t.stride()), t.element_size(), layout)
    if t.data_ptr() % ALIGN_BYTES or any(s % ALIGN_BYTES or s >= MAX_STRIDE for s in strides):
        raise ValueError(
            f"TMA needs a 16-byte aligned pointer and 16-byte multiple strides below 2^40: "
            f"pointer {t.data_ptr():#x}, byte strides {strides}"
        )
    encoded: Any = call(
        "cuTensorMapEncodeTiled",
        kinds[t.dtype],
        4,
        t.data_ptr(),
        [cu.cuuint64_t(x) for x in dims],
        [cu.cuuint64_t(x) for x in strides],
        [cu.cuuint32_t(x) for x in (BOX_COLS, box_rows, 1, 1)],
        [cu.cuuint32_t(1)] * 4,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    out = TensorMap()
    ctypes.memmove(ctypes.addressof(out), int(encoded.getPtr()), TENSOR_MAP_BYTES)
    return out


def fa3_tensor_maps(
    config: AnyConfig,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: str,
) -> tuple[TensorMap, TensorMap, TensorMap]:
    """The fa3 family's ``host_prep``: the kernel's extra arguments ``(tma_q, tma_k, tma_v)``.

    The signature every family's ``host_prep`` has (:func:`measure.loader.extra_args` calls
    it): ``(config, q, k, v, layout)`` -> the kernel arguments after ``FaParams``, in order,
    each a ctypes value whose bytes are the argument. Call it after
    :func:`measure.params.make_params` has checked the tensors; the descriptors hold the
    tensors' addresses, so they are valid while those tensors live.

    Args:
        config: an :class:`~core.fa3_config.Fa3Config` (Q boxes of ``block_m`` rows, K and V
            boxes of ``block_n``).
        q, k, v: the launch's inputs, ``[B, N, H, D]`` or ``[B, H, N, D]`` as ``layout`` says.
        layout: ``"bnhd"`` or ``"bhnd"``.

    Raises:
        TypeError: ``config`` is not an fa3 config.
        ValueError: a tensor's dtype or head dim differs from the config's, or it breaks
            TMA's alignment rules (see :func:`encode_tensor_map`); a varlen config (its kernel
            takes ``FaVarlen`` before the descriptors: :func:`fa3_varlen_tensor_maps`).
        CudaError: the driver rejects a descriptor.
    """
    if not isinstance(config, Fa3Config):
        raise TypeError(f"fa3_tensor_maps takes an fa3 config, got {config.name}")
    if config.varlen:
        raise ValueError(f"{config.name} is a varlen kernel: see fa3_varlen_tensor_maps")
    return _tensor_maps(config, q, k, v, layout)


def _tensor_maps(
    config: Fa3Config, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str
) -> tuple[TensorMap, TensorMap, TensorMap]:
    from core.elements import element

    want = element(config.dtype).torch_name
    for name, t in (("q", q), ("k", k), ("v", v)):
        if str(t.dtype).removeprefix("torch.") != want or int(t.shape[-1]) != config.d:
            raise ValueError(
                f"{config.name} takes {want} tensors with D={config.d}; "
                f"{name} is {t.dtype} with D={t.shape[-1]}"
            )
    return (
        encode_tensor_map(q, layout, config.block_m),
        encode_tensor_map(k, layout, config.block_n),
        encode_tensor_map(v, layout, config.block_n),
    )


def fa3_cache_tensor_maps(
    config: AnyConfig,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    capacity: int,
) -> tuple[TensorMap, TensorMap, TensorMap]:
    """The descriptors of an fa3 KV-cache launch (``_kvc`` configs): Q ``[B, Nq, Hq, D]`` as
    a dense launch's, K and V over the caches as they are, ``[rows, capacity, Hkv, D]`` or
    pages ``[pages, P, Hkv, D]`` (the page is the batch coordinate; codegen/templates/
    fa3_fwd.cuh, "KV caches"), in boxes of :attr:`~core.fa3_config.Fa3Config.kv_box_rows`
    rows. ``capacity`` is not read (the kernel's limit is FaParams' nk).

    Raises:
        TypeError: ``config`` is not an fa3 cache config.
        ValueError: a tensor's dtype or head dim differs from the config's, or it breaks
            TMA's alignment rules (see :func:`encode_tensor_map`).
        CudaError: the driver rejects a descriptor.
    """
    if not (isinstance(config, Fa3Config) and config.kvcache):
        raise TypeError(f"fa3_cache_tensor_maps takes an fa3 _kvc config, got {config.name}")
    maps = _tensor_maps(config, q, k_cache, v_cache, "bnhd")
    if config.kv_box_rows == config.block_n:
        return maps
    return (
        maps[0],
        encode_tensor_map(k_cache, "bnhd", config.kv_box_rows),
        encode_tensor_map(v_cache, "bnhd", config.kv_box_rows),
    )


def fa3_varlen_tensor_maps(
    config: AnyConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[TensorMap, TensorMap, TensorMap]:
    """The descriptors of an fa3 varlen launch: Q, K and V packed ``[total, heads, D]``.

    Each is described as a ``[1, total, heads, D]`` (``bnhd``) tensor, so the kernel's tile
    loads are those of the dense kernel with the batch coordinate 0 and the row coordinate
    offset by the sequence's first row (``cu_seqlens``). A tile that runs past its sequence
    loads the next sequence's rows, which the kernel masks (keys) or never stores (queries);
    past the last row TMA fills zeros.

    Raises:
        TypeError: ``config`` is not an fa3 varlen config.
        ValueError: a tensor is not 3-d, its dtype or head dim differs from the config's, or
            it breaks TMA's alignment rules (see :func:`encode_tensor_map`).
        CudaError: the driver rejects a descriptor.
    """
    if not (isinstance(config, Fa3Config) and config.varlen):
        raise TypeError(f"fa3_varlen_tensor_maps takes an fa3 _vl config, got {config.name}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be packed [total, heads, D], got shape {tuple(t.shape)}")
    return _tensor_maps(config, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), "bnhd")
