"""Which varlen kernel config serves a packed batch, and the op's decision key (torch-free).

``fa2tune.torch.attention_varlen`` never reads ``cu_seqlens`` on the host (that would wait for
the GPU on every call), so a packed batch is known at choice time only by what the tensors'
shapes and the caller's ints say: the number of sequences (``cu_seqlens_q.numel() - 1``) and
the mean query length (``total_q // num_seqs``). The store compares varlen problems in
exactly these terms (:func:`core.shape.varlen_shape`: count of sequences at their mean
length), so :meth:`db.store.Store.best_varlen_shape` answers with the config of the nearest
tuned varlen problem of this GPU, head dim, dtype and mask; with nothing tuned (or a tuned
config whose family does not build here: fa3 needs compute capability 9.0), FlashAttention-2's
default config's varlen twin serves (:func:`default_varlen_config`).

Only the local results serve varlen calls (shipped results and ``FA2TUNE_DB_URL``); the
service and first-use tuning are not asked (they take whole length lists). In ``off`` mode
the default serves.

Nothing here imports torch: :mod:`fa2tune.ops.varlen_op` turns tensors into plain values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from codegen.families.fa2 import space as fa2_space
from core.config import HEAD_DIMS_RULE, Dtype
from core.fa2_config import Fa2Config
from core.shape import Shape, effective_causal, varlen_shape
from db.store import Store
from fa2tune.ops import autotune
from fa2tune.ops.choice import DTYPE_NAMES, Choice, Unsupported, arch_of, builds_here, open_store

log = logging.getLogger(__name__)

#: Most packed rows the kernels' int32 offsets address (as measure.varlen.MAX_TOTAL_ROWS).
MAX_TOTAL_ROWS = 2**31 - 1

#: Head dims a varlen call can be served at: FlashAttention-2's (its default's varlen twin
#: serves every one; the Hopper family's head dims are among them).
VARLEN_HEAD_DIMS: tuple[int, ...] = fa2_space.VALID_HEAD_DIMS


def mean_bucket(total_q: int, count: int) -> int:
    """The mean query length of a packed batch, rounded to the nearest power of two (by
    ratio: 1, 2, 4, ...; 0 rows count as 1).

    Why a bucket and not the mean itself: in a serving loop ``total_q`` changes on nearly
    every call, and a decision per exact mean would ask the store (and maybe build a kernel)
    far too often. The store's nearness is by ratio (tuned lengths are spaced geometrically,
    :func:`core.shape.shape_distance`), so means within one power-of-two bucket almost always
    pick the same tuned problem anyway; asking with the bucket's own value (not the first
    call's mean) makes the decision a function of the key alone, whichever call came first.
    """
    mean = total_q // count if count > 0 else 0
    if mean <= 1:
        return 1
    low = 1 << (mean.bit_length() - 1)
    return 2 * low if mean * mean >= 2 * low * low else low  # split at low * sqrt(2)


def effective_varlen_causal(causal: bool, max_seqlen_q: int) -> bool:
    """A causal packed batch whose longest sequence has one query row is served unmasked:
    the mask is bottom-right aligned per sequence, so one row sees every key of its sequence
    (:func:`core.shape.effective_causal`'s rule; no rows at all count as one)."""
    return effective_causal(causal, max(max_seqlen_q, 1))


def decision_key(
    device: object,
    dtype: object,
    d: int,
    heads: int,
    kv_heads: int,
    causal: bool,
    count: int,
    total_q: int,
    max_seqlen_q: int,
) -> tuple[object, ...]:
    """The key the op caches a varlen decision by: (device, dtype, D, Hq, Hkv, effective
    causal, number of sequences, :func:`mean_bucket`). The number of sequences is kept exact
    (it is bounded by a server's batch size, so it adds few keys); the launch geometry, which
    also depends on ``max_seqlen_q``, is worked out per call and is not part of the key."""
    return (device, dtype, d, heads, kv_heads, effective_varlen_causal(causal, max_seqlen_q),
            count, mean_bucket(total_q, count))  # fmt: skip


def varlen_reason(*, device_type: str, dtype: str, d: int) -> str | None:
    """Why a varlen call's tensors cannot go to the kernels (None when they can, as far as the
    tensors alone tell).

    Args:
        device_type: ``q.device.type``.
        dtype: the torch dtype's name (``"float16"``).
        d: head dim.
    """
    if device_type != "cuda":
        return f"tensors on {device_type}, not on a CUDA device"
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype} (the kernels take float16 and bfloat16)"
    if d not in VARLEN_HEAD_DIMS:
        return f"head dim {d} is not supported for packed batches (supported: {HEAD_DIMS_RULE})"
    return None


@dataclass(frozen=True)
class VarlenCall:
    """What a varlen decision depends on: the device and the batch as the key sees it.

    Attributes:
        count: number of sequences; mean: the bucketed mean query length (:func:`mean_bucket`).
    """

    device: int
    gpu: str
    sm_count: int
    compute_capability: str
    dtype: Dtype
    causal: bool
    d: int
    heads: int
    kv_heads: int
    count: int
    mean: int

    @property
    def shape(self) -> Shape:
        """The dense shape the store compares this batch by (``count`` x ``mean``)."""
        return Shape(self.mean, self.mean, self.count, self.heads, self.kv_heads)

    def describe(self, choice: Choice) -> str:
        """One line for FA2TUNE_PRINT_CHOICE."""
        mask = "causal" if self.causal else "full"
        return (f"{self.gpu} {self.dtype} {mask} D={self.d} packed {self.count} sequences, "
                f"mean ~{self.mean}: {choice.describe(self.shape)}")  # fmt: skip


def default_varlen_config(d: int, dtype: Dtype, causal: bool) -> Fa2Config:
    """FlashAttention-2's default config for ``d`` as a packed-sequence (``_vl``) kernel.

    Raises:
        ValueError: ``d`` is not a FlashAttention-2 head dim.
    """
    return replace(fa2_space.fa2_default_config(d, dtype, causal), varlen=True)


def check_varlen_supported(dtype: str, d: int, compute_capability: str) -> None:
    """Refuse what no varlen kernel serves.

    Raises:
        Unsupported: a dtype, a head dim or a GPU fa2tune builds nothing for.
    """
    if dtype not in DTYPE_NAMES.values():
        raise Unsupported(f"dtype {dtype} is not fp16 or bf16")
    if d not in VARLEN_HEAD_DIMS:
        raise Unsupported(f"head dim {d} is not supported for packed batches "
                          f"(supported: {HEAD_DIMS_RULE})")  # fmt: skip
    if arch_of(compute_capability) is None:
        raise Unsupported(
            f"no fa2tune build for compute capability {compute_capability} "
            f"(builds: {', '.join(fa2_space.SUPPORTED_ARCHS)})"
        )


def choose_varlen_config(store: Store | None, call: VarlenCall) -> Choice:
    """The config for a packed batch: the nearest tuned varlen problem's winner (source
    ``nearest``, ``measured`` its count x mean shape), else the FA2 default's varlen twin
    (``default``).

    Args:
        store: the database (shipped results loaded), or None for the default only.
        call: the batch as the decision key sees it.

    Raises:
        Unsupported: see :func:`check_varlen_supported`.
    """
    check_varlen_supported(call.dtype, call.d, call.compute_capability)
    if store is not None:
        try:
            found = store.best_varlen_shape(
                call.gpu, call.d, call.dtype, call.causal, call.count, call.mean, call.heads,
                call.kv_heads,
            )  # fmt: skip
        except Exception as exc:  # a broken database must not break the model: the default
            log.warning("fa2tune.torch: database lookup failed, using defaults: %s", exc)
            found = None
        if found is not None:
            best, lens = found
            config = best.config
            if getattr(config, "varlen", False) and builds_here(config, call.compute_capability):
                measured = varlen_shape(lens, best.heads, best.kv_heads)
                return Choice(config, "nearest", measured)
    config = default_varlen_config(call.d, call.dtype, call.causal)
    if not builds_here(config, call.compute_capability):  # pragma: no cover - arch_of refuses
        raise Unsupported(f"no varlen kernel builds for compute capability "
                          f"{call.compute_capability}")  # fmt: skip
    return Choice(config, "default")


def select_varlen(call: VarlenCall) -> Choice:
    """The config for ``call``: the default only in ``off`` mode, else
    :func:`choose_varlen_config` on the local results (shipped plus ``FA2TUNE_DB_URL``).

    Raises:
        Unsupported: see :func:`check_varlen_supported`.
    """
    if autotune.current().mode == "off":
        return choose_varlen_config(None, call)
    return choose_varlen_config(open_store(), call)


def check_varlen_shapes(
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    cu_q_shape: tuple[int, ...],
    cu_k_shape: tuple[int, ...],
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Refuse packed calls no attention implementation takes (a caller's error, never a
    fallback): what the shapes and the caller's ints say, nothing read from the device.

    Raises:
        ValueError: q, k, v not 3-d ``[total, heads, D]``; k and v of different shapes; head
            dims that differ; q heads not a multiple of kv heads; offsets not 1-d with
            ``num_seqs + 1 >= 2`` entries each, or different counts for q and k; a negative
            max length, or ``max_seqlen_q`` 0 with query rows to compute; more rows than
            int32 offsets address.
    """
    dims = (len(q_shape), len(k_shape), len(v_shape))
    if dims != (3, 3, 3):
        raise ValueError(f"q, k, v must be 3-d packed [total, heads, D], got {dims} dims")
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k shape {tuple(k_shape)} != v shape {tuple(v_shape)}")
    _, hq, d = q_shape
    _, hk, dk = k_shape
    if d != dk or hk < 1 or hq % hk:
        raise ValueError(
            f"q {tuple(q_shape)} and k {tuple(k_shape)} do not match: same head dim, and q "
            "heads a multiple of kv heads"
        )
    for name, shape in (("cu_seqlens_q", cu_q_shape), ("cu_seqlens_k", cu_k_shape)):
        if len(shape) != 1 or shape[0] < 2:
            raise ValueError(
                f"{name} must be 1-d with num_seqs + 1 >= 2 entries, got shape {tuple(shape)}"
            )
    if cu_q_shape[0] != cu_k_shape[0]:
        raise ValueError(
            f"cu_seqlens_q has {cu_q_shape[0]} entries but cu_seqlens_k {cu_k_shape[0]} "
            "(num_seqs + 1 each)"
        )
    if max_seqlen_q < 0 or max_seqlen_k < 0:
        raise ValueError(f"max_seqlen_q {max_seqlen_q}, max_seqlen_k {max_seqlen_k}: negative")
    if max_seqlen_q == 0 and q_shape[0] > 0:
        raise ValueError(f"max_seqlen_q is 0 but q has {q_shape[0]} rows")
    if max(q_shape[0], k_shape[0]) > MAX_TOTAL_ROWS:
        raise ValueError(f"more than {MAX_TOTAL_ROWS} packed rows (int32 offsets)")
