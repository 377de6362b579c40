"""Which kernel config serves one attention call, and why a call is not served (torch-free).

The rule is ``fa2tune best``'s: the results shipped with the package plus the local database
(``FA2TUNE_DB_URL``), asked through :meth:`db.store.Store.best_for_shape` for this GPU's name,
head dim, dtype, mask and the call's whole :class:`~core.shape.Shape`: the config measured at
exactly this shape (source ``exact``), else the one measured at the nearest tuned shape
(``nearest``). With nothing tuned for the GPU, head dim, dtype and mask (or a tuned config
whose family does not build for this GPU) a family's default config serves (``default``):
the split-KV family's for decode-like calls (few packed query rows that would leave most SMs
idle with one block per 128 query rows), FlashAttention-2's otherwise.

Nothing here imports torch: the op (:mod:`fa2tune.ops.torch_op`) turns tensors into plain
values and asks :func:`choose_config` and :func:`call_reason`, so these rules are tested on
machines without torch or a GPU.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal

from codegen.families import family_of
from codegen.families.fa2 import space as fa2_space
from codegen.families.fa3 import space as fa3_space
from codegen.families.splitkv import space as splitkv_space
from core.config import HEAD_DIMS_RULE, Dtype
from core.family import AnyConfig
from core.problem import Problem
from core.shape import NOMINAL_BLOCK_ROWS, Shape
from core.splitkv_config import SplitKvConfig
from db.store import Store

log = logging.getLogger(__name__)

#: Where a choice came from: measured at the call's shape, at the nearest tuned shape, or a
#: family's default (nothing tuned).
Source = Literal["exact", "nearest", "default"]

#: Who answered: the local database (with the shipped results) or a running fa2tune service.
Origin = Literal["local", "service"]

#: Head dims some family has kernels for (fa2's, fa3's and split-KV's).
SUPPORTED_HEAD_DIMS: tuple[int, ...] = tuple(
    sorted({*fa2_space.VALID_HEAD_DIMS, *fa3_space.HEAD_DIMS, *splitkv_space.HEAD_DIMS})
)

#: torch dtype names (``str(torch.float16)`` without ``torch.``) -> the store's dtype names.
DTYPE_NAMES: dict[str, Dtype] = {"float16": "fp16", "bfloat16": "bf16"}


def unsupported_head_dim(d: int) -> str:
    """The reason given for a head dim no family has."""
    return f"head dim {d} is not supported (supported: {HEAD_DIMS_RULE})"


class Unsupported(RuntimeError):
    """A call fa2tune's kernels cannot serve; ``reason`` says why in a few words.

    Raised by ``fa2tune.torch.attention(..., fallback=False)``; with the default
    ``fallback=True`` the call runs on SDPA instead and the reason is warned about once.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FallbackWarning(UserWarning):
    """A call ran on ``torch.nn.functional.scaled_dot_product_attention`` instead."""


@dataclass(frozen=True)
class Choice:
    """The config that serves a call and where it came from.

    Attributes:
        config: the kernel config (any family).
        source: ``exact``, ``nearest`` or ``default``.
        measured: the shape the config was measured at (None for a default).
        origin: who answered: ``local`` (shipped results and the local database, or a
            default) or ``service`` (a running fa2tune service, ``FA2TUNE_SERVICE_URL``).
    """

    config: AnyConfig
    source: Source
    measured: Shape | None = None
    origin: Origin = "local"

    def describe(self, asked: Shape) -> str:
        """One line: ``asked -> config (source[, measured at], from)``, ``from`` being
        ``database`` (the shipped results and the local database) or ``service``; a default
        says ``(default)``."""
        where = ""
        if self.source == "nearest" and self.measured is not None:
            where = f", measured at {self.measured.describe()}"
        if self.source != "default":
            where += ", service" if self.origin == "service" else ", database"
        return f"{asked.describe()} -> {self.config.name} ({self.source}{where})"


def arch_of(compute_capability: str) -> str | None:
    """The build target of a GPU (``"9.0"`` -> ``"sm_90"``); None when fa2tune has none."""
    try:
        major, minor = (int(x) for x in compute_capability.split(".")[:2])
    except ValueError:
        return None
    arch = f"sm_{major}{minor}"
    return arch if arch in fa2_space.SUPPORTED_ARCHS else None


def _decode_like(shape: Shape, d: int, dtype: Dtype, causal: bool, sm_count: int) -> bool:
    """Whether split-KV's default beats FA2's here: the split-KV family serves the shape (few
    packed query rows per KV head) and one block per 128 query rows would not fill the GPU."""
    problem = Problem(
        gpu="", d=d, n=shape.nq, nk=shape.nk, batch=shape.batch, heads=shape.heads,
        kv_heads=shape.kv_heads, dtype=dtype, causal=causal,
    )  # fmt: skip
    blocks = -(-shape.nq // NOMINAL_BLOCK_ROWS) * shape.heads * shape.batch
    return splitkv_space.serves(problem) and blocks < max(sm_count, 1)


def default_config(
    d: int, dtype: Dtype, causal: bool, shape: Shape, sm_count: int
) -> AnyConfig | None:
    """The config that serves an untuned call, or None when no family has head dim ``d``.

    Split-KV's default for decode-like calls (see :func:`_decode_like`) and for head dims
    only split-KV has; FlashAttention-2's default otherwise.
    """
    in_splitkv = d in splitkv_space.HEAD_DIMS
    if in_splitkv and _decode_like(shape, d, dtype, causal, sm_count):
        return splitkv_space.default_config(d, dtype, causal)
    if d in fa2_space.VALID_HEAD_DIMS:
        return fa2_space.fa2_default_config(d, dtype, causal)
    if in_splitkv:
        return splitkv_space.default_config(d, dtype, causal)
    return None


def builds_here(config: AnyConfig, compute_capability: str) -> bool:
    """Whether ``config``'s family builds for a GPU of this compute capability."""
    return family_of(config).arch_for(compute_capability) is not None


def check_supported(dtype: str, d: int, compute_capability: str) -> None:
    """Refuse what no family serves: a dtype, a head dim or a GPU fa2tune builds nothing for.

    Raises:
        Unsupported: naming which.
    """
    if dtype not in DTYPE_NAMES.values():
        raise Unsupported(f"dtype {dtype} is not fp16 or bf16")
    if d not in SUPPORTED_HEAD_DIMS:
        raise Unsupported(unsupported_head_dim(d))
    if arch_of(compute_capability) is None:
        raise Unsupported(
            f"no fa2tune build for compute capability {compute_capability} "
            f"(builds: {', '.join(fa2_space.SUPPORTED_ARCHS)})"
        )


def choose_config(
    store: Store | None,
    gpu: str,
    sm_count: int,
    shape: Shape,
    dtype: str,
    causal: bool,
    d: int,
    *,
    compute_capability: str = "9.0",
) -> Choice:
    """The config for a call on this GPU (``fa2tune best``'s rule, then a default).

    Args:
        store: the database to ask (shipped results already loaded), or None for defaults
            only (no database could be opened).
        gpu: the GPU's name as the driver reports it (``"NVIDIA H200"``).
        sm_count: its SM count (the default's decode-like test).
        shape: the call's shape.
        dtype: ``"fp16"`` or ``"bf16"``.
        causal: bottom-right aligned causal mask.
        d: head dim.
        compute_capability: the GPU's (``"9.0"``): a tuned config whose family does not build
            for it is passed over (fa3 needs exactly 9.0).

    Raises:
        Unsupported: an unsupported head dim or dtype, or a GPU fa2tune builds nothing for.
    """
    check_supported(dtype, d, compute_capability)
    typed: Dtype = "fp16" if dtype == "fp16" else "bf16"
    if store is not None:
        try:
            found = store.best_for_shape(gpu, d, typed, causal, shape)
        except Exception as exc:  # a broken database must not break the model: defaults
            log.warning("fa2tune.torch: database lookup failed, using defaults: %s", exc)
            found = None
        if found is not None and builds_here(found.config, compute_capability):
            measured = Shape(found.n, found.nk, found.batch, found.heads, found.kv_heads)
            return Choice(found.config, "exact" if found.exact else "nearest", measured)
    config = default_config(d, typed, causal, shape, sm_count)
    if config is None or not builds_here(config, compute_capability):
        raise Unsupported(f"no kernel family serves head dim {d} on compute capability "
                          f"{compute_capability}")  # fmt: skip
    return Choice(config, "default")


def splitkv_workspace_sizes(config: SplitKvConfig, shape: Shape) -> tuple[int, int]:
    """``(counters, partial rows)`` of a split-KV launch's workspace: one int32 counter per
    row tile and ``tiles * splits * rows`` float32 rows of partial O (``d`` each) and LSE (1
    each); ``(0, 0)`` with one split (the kernel then touches no workspace).

    From :meth:`SplitKvConfig.workspace_bytes`, so the formula lives in one place: with
    ``splits`` and ``rows`` known, ``bytes = tiles * 4 * (splits * rows * (d + 1) + 1)``.
    """
    total = config.workspace_bytes(shape.nq, shape.heads, shape.kv_heads, shape.batch, shape.nk)
    splits = config.splits_for(shape.nk)
    per_tile = 4 * (splits * config.rows * (config.d + 1) + 1)
    tiles, rest = divmod(total, per_tile)
    if rest:  # pragma: no cover - workspace_bytes changed its layout
        raise AssertionError(f"{config.name}: {total} workspace bytes are not whole row tiles")
    return tiles, tiles * splits * config.rows


def call_reason(
    *,
    device_type: str,
    dtype: str,
    d: int,
    ndim: int = 4,
    requires_grad: bool = False,
) -> str | None:
    """Why a call's tensors cannot go to the kernels (None when they can, as far as tensors
    alone tell: the GPU, the build and the strides are checked later).

    Args:
        device_type: ``q.device.type`` (``"cuda"``, ``"cpu"``).
        dtype: the torch dtype's name (``"float16"``, ``"float32"``).
        d: head dim.
        ndim: the tensors' number of dimensions.
        requires_grad: gradients are recorded for the call (the kernels are forward-only).
    """
    if device_type != "cuda":
        return f"tensors on {device_type}, not on a CUDA device"
    if ndim != 4:
        return f"{ndim}-d tensors (the kernels take 4-d)"
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype} (the kernels take float16 and bfloat16)"
    if d not in SUPPORTED_HEAD_DIMS:
        return unsupported_head_dim(d)
    if requires_grad:
        return "gradients are recorded (the kernels are forward-only)"
    return None


_store_lock = threading.Lock()
_store: list[Store | None] = []  # one entry once opened (None: could not be opened)


def open_store() -> Store | None:
    """The database of the settings with the shipped results loaded, once per process.

    None (after one warning) when it cannot be opened: calls then get default configs.
    """
    with _store_lock:
        if _store:
            return _store[0]
        from core.settings import get_settings
        from db.dump_format import TransferError
        from db.shipped import load_shipped_results

        store: Store | None
        try:
            store = Store.from_url(get_settings().db_url)
        except Exception as exc:
            log.warning("fa2tune.torch: database not opened, using default configs: %s", exc)
            store = None
        if store is not None:
            try:
                load_shipped_results(store)
            except (TransferError, OSError) as exc:  # as `fa2tune best`: the user's own stay
                log.error("fa2tune.torch: shipped results not loaded: %s", exc)
        _store.append(store)
        return store


def reset_store() -> None:
    """Forget the opened database (tests point ``FA2TUNE_DB_URL`` elsewhere between cases)."""
    with _store_lock:
        if _store and _store[0] is not None:
            _store[0].close()
        _store.clear()
