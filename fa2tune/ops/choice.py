"""Which kernel config serves one attention call, and why a call is not served (torch-free).

One rule for both modes of a call (a :class:`Call`: dense, or a packed variable-length batch
with a :class:`~core.lookup.Packed` descriptor), ``fa2tune best``'s: the results
shipped with the package plus the local database (``FA2TUNE_DB_URL``), asked through the
store's one lookup rule (:func:`core.lookup.pick`, as :meth:`db.store.Store.best_match`
applies it) for this GPU's name, head dim, dtype, mask and the call's shape: the config
measured at exactly this shape (source ``exact``), else the one measured at the nearest
tuned shape of the same mode and phase (``nearest``; decode steps and prefill never answer
each other: :func:`core.shape.same_phase`; a packed batch is known here only as its count of
sequences at a mean length, so it is never exact).
With nothing tuned (or a tuned config whose family does not build for this GPU) a default
serves (``default``): for a dense call the split-KV family's for decode-like calls (a decode
step, :func:`core.shape.is_decode`, or few packed query rows that would leave most SMs idle
with one block per 128 query rows), FlashAttention-2's otherwise; for a packed batch
FlashAttention-2's default's varlen twin.

A packed call is known by what its tensors' shapes and the caller's ints say, never by its
offsets (reading them would wait for the GPU): the number of sequences and the mean query
length, bucketed (:func:`mean_bucket`), which with the device, dtype, head dim, heads and
effective mask is the op's decision key (:func:`decision_key`).

A call with an attention variant (:mod:`core.variant`: a window, a chunk, a softcap, sinks)
carries it normalised (:func:`normalize_call`) in its :class:`Call` and its decision key:
the store is asked for configs built with exactly the variant's switches, and a default is
the family default with those switches set (``dataclasses.replace(config,
**variant.needs)``), served only by a family whose kernels are built with them (its space
says so); otherwise the call is not served (the op falls back, or raises with the reason).

The store is read once per group of calls that share the lookup's candidates (GPU, head dim,
dtype, served mask, mode, variant switches: :meth:`db.store.Store.candidate_set`), and every
later shape of the group is matched in memory: a decode loop whose cache grows by one key a
step asks the database once, not once a step. Results the process itself tunes (first-use
tuning) are seen at once (:func:`forget_results`); results other processes write later are
seen after :func:`forget_results` (``fa2tune.torch.clear_caches``) or a restart, as the op's
decisions always were.

Nothing here imports torch: the op (:mod:`fa2tune.ops.torch_op`) turns tensors into plain
values and asks :func:`choose` and :func:`call_reason`, so these rules are tested on machines
without torch or a GPU.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Literal, cast

from codegen.families import FAMILIES, family, family_of
from codegen.targets import SUPPORTED_ARCHS, facts_for, target_for
from core.config import HEAD_DIMS_RULE, Dtype
from core.fa2_config import Fa2Config
from core.family import AnyConfig
from core.gpu_name import normalize_gpu_name
from core.lookup import Packed, served_mask
from core.problem import Problem
from core.shape import NOMINAL_BLOCK_ROWS, Shape, effective_causal, is_decode
from core.variant import PLAIN, Variant, normalize
from db.queries import CandidateSet
from db.store import Store

log = logging.getLogger(__name__)

#: Where a choice came from: measured at the call's shape, at the nearest tuned shape, or a
#: family's default (nothing tuned).
Source = Literal["exact", "nearest", "default"]

#: Who answered: the local database (with the shipped results) or a running fa2tune service.
Origin = Literal["local", "service"]

#: Head dims some family has kernels for (the registry's families').
SUPPORTED_HEAD_DIMS: tuple[int, ...] = tuple(
    sorted({d for f in FAMILIES.values() for d in f.head_dims})
)

#: Head dims a packed call can be served at: FlashAttention-2's (its default's varlen twin
#: serves every one; the Hopper family's head dims are among them).
VARLEN_HEAD_DIMS: tuple[int, ...] = family("fa2").head_dims

#: Most packed rows the kernels' int32 offsets address (as measure.varlen.MAX_TOTAL_ROWS).
MAX_TOTAL_ROWS = 2**31 - 1

#: torch dtype names (``str(torch.float16)`` without ``torch.``) -> the store's dtype names.
DTYPE_NAMES: dict[str, Dtype] = {"float16": "fp16", "bfloat16": "bf16"}


def unsupported_head_dim(d: int, packed: bool = False) -> str:
    """The reason given for a head dim no family has (for packed batches when ``packed``)."""
    what = " for packed batches" if packed else ""
    return f"head dim {d} is not supported{what} (supported: {HEAD_DIMS_RULE})"


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
        measured: the shape the config was measured at (None for a default; a packed
            problem's count of sequences at their mean length).
        origin: who answered: ``local`` (shipped results and the local database, or a
            default) or ``service`` (a running fa2tune service, ``FA2TUNE_SERVICE_URL``).
        kv_page: for a call over a KV cache (:mod:`fa2tune.ops.cache_choice`), the layout the
            config was measured on as a cache kernel (a tuned cache problem's: 0 contiguous,
            P paged); None when its tile was measured on a dense problem, or is a default.
        kv_lengths: with ``kv_page``, the length pattern it was tuned on (``full``,
            ``mixed``: :mod:`core.kv_lengths`).
    """

    config: AnyConfig
    source: Source
    measured: Shape | None = None
    origin: Origin = "local"
    kv_page: int | None = None
    kv_lengths: str = "full"

    def describe(self, asked: Shape) -> str:
        """One line: ``asked -> config (source[, measured at], from)``, ``from`` being
        ``database`` (the shipped results and the local database) or ``service``; a default
        says ``(default)``."""
        where = ""
        if self.source == "nearest" and self.measured is not None:
            where = f", measured at {self.measured.describe()}"
        if self.kv_page is not None:
            mix = " on mixed lengths" if self.kv_lengths == "mixed" else ""
            where += f", tuned as a KV-cache kernel{mix}"
        if self.source != "default":
            where += ", service" if self.origin == "service" else ", database"
        return f"{asked.describe()} -> {self.config.name} ({self.source}{where})"


@dataclass(frozen=True)
class Call:
    """What a decision depends on: the device and the call's shape, dtype, mask and mode.

    Attributes:
        shape: the call's shape; a packed batch's is ``packed.shape(heads, kv_heads)``.
        causal: the effective mask (:func:`core.shape.effective_causal`'s rule).
        packed: the packed batch's descriptor (count, bucketed mean), None for a dense call.
        variant: the call's attention variant, normalised (:func:`normalize_call`).
    """

    device: int
    gpu: str
    sm_count: int
    compute_capability: str
    shape: Shape
    dtype: Dtype
    causal: bool
    d: int
    packed: Packed | None = None
    variant: Variant = PLAIN

    def problem(self) -> Problem:
        """The tuning problem of a dense call (what ``fa2tune tune`` would tune)."""
        s = self.shape
        return Problem(
            gpu=self.gpu, d=self.d, n=s.nq, nk=s.nk, batch=s.batch, heads=s.heads,
            kv_heads=s.kv_heads, dtype=self.dtype, causal=self.causal, variant=self.variant,
        )  # fmt: skip

    @property
    def tag(self) -> tuple[int, str, int, bool, Shape, Variant]:
        """The key the op's decisions are forgotten by when a tuning job ends."""
        return (self.device, self.dtype, self.d, self.causal, self.shape, self.variant)

    def describe(self, line: str, layout: str) -> str:
        """One line for FA2TUNE_PRINT_CHOICE: the call, then ``line`` (the choice's)."""
        mask = "causal" if self.causal else "full"
        if not self.variant.plain:
            mask += f" ({self.variant.describe()})"
        p = self.packed
        how = layout if p is None else f"packed {p.count} sequences, mean ~{p.mean}"
        return f"{self.gpu} {self.dtype} {mask} D={self.d} {how}: {line}"


def arch_of(compute_capability: str) -> str | None:
    """The build target of a GPU (``"9.0"`` -> ``"sm_90"``, ``"8.8"`` -> ``"sm_87"`` with one
    log line: :func:`codegen.targets.target_for`); None when fa2tune has none it can run."""
    try:
        return target_for(compute_capability)
    except ValueError:
        return None


#: A shared-memory limit no config reaches: a default asked only whether its family's
#: kernels take a variant's switches (its other rules hold already).
ANY_SMEM = 1 << 40


def with_variant(config: AnyConfig, variant: Variant) -> tuple[AnyConfig | None, str]:
    """``config`` built for ``variant`` (``dataclasses.replace(config, **variant.needs)``) and
    ``""``, or ``(None, why)`` when its family's kernels are not built with those switches
    (the family's space says which it takes). A plain variant leaves the config as it is."""
    if variant.plain:
        return config, ""
    try:
        built: AnyConfig = replace(cast(Any, config), **variant.needs)
    except TypeError:  # a config type that declares no switches (a plug-in family)
        return None, f"the {config.family} family has no variant kernels"
    ok, why = family_of(built).check(built, ANY_SMEM)
    return (built, "") if ok else (None, why)


def smem_limit_of(compute_capability: str) -> int | None:
    """Shared memory per block a GPU of ``compute_capability`` offers, from its target's
    table (:func:`codegen.targets.facts_for`); None where fa2tune has no target for it."""
    try:
        facts = facts_for(compute_capability)
    except ValueError:
        return None
    return facts.smem_per_block if facts is not None else None


def _default_candidates(
    d: int, dtype: Dtype, causal: bool, shape: Shape, sm_count: int, smem_limit: int | None
) -> list[AnyConfig]:
    """The plain defaults of a dense call, best first (see :func:`default_config`), each
    fitted to ``smem_limit`` (:meth:`Family.default_within`; one that cannot fit is left
    out)."""
    fa2, splitkv = family("fa2"), family("splitkv")
    in_splitkv = d in splitkv.head_dims
    problem = Problem(
        gpu="", d=d, n=shape.nq, nk=shape.nk, batch=shape.batch, heads=shape.heads,
        kv_heads=shape.kv_heads, dtype=dtype, causal=causal,
    )  # fmt: skip
    # A decode step goes to split-KV whatever its grid: it reads each K/V head once for its
    # whole packed GQA group, where FlashAttention-2's tile reads it once per query head and
    # spends a 128-row block on one row. A few more rows go to it while one block per 128
    # query rows would leave SMs idle.
    blocks = -(-shape.nq // NOMINAL_BLOCK_ROWS) * shape.heads * shape.batch
    few_blocks = is_decode(shape) or blocks < max(sm_count, 1)
    decode = in_splitkv and splitkv.serves(problem) and few_blocks
    out: list[AnyConfig | None] = []
    if decode:
        out.append(splitkv.default_within(d, dtype, causal, smem_limit))
    if d in fa2.head_dims:
        out.append(fa2.default_within(d, dtype, causal, smem_limit))
    if in_splitkv and not decode:
        out.append(splitkv.default_within(d, dtype, causal, smem_limit))
    return [c for c in out if c is not None]


def default_config(
    d: int,
    dtype: Dtype,
    causal: bool,
    shape: Shape,
    sm_count: int,
    variant: Variant = PLAIN,
    smem_limit: int | None = None,
) -> AnyConfig | None:
    """The config that serves an untuned dense call, or None when no family has head dim ``d``
    (or, for a ``variant``, none whose kernels take its switches).

    Split-KV's default for decode-like calls (the split-KV family serves the shape, few packed
    query rows per KV head, and the call is a decode step or one block per 128 query rows
    would not fill the GPU) and for
    head dims only split-KV has; FlashAttention-2's default otherwise. Both from the family
    registry. With a variant, the first of these whose family builds the variant's switches,
    with them set. With ``smem_limit`` (the GPU's shared memory per block), each is fitted
    to it first (split-KV's default is sized for sm_90's 227 KB; 99 KB GPUs run a smaller
    tile of it).
    """
    for config in _default_candidates(d, dtype, causal, shape, sm_count, smem_limit):
        built, _ = with_variant(config, variant)
        if built is not None:
            return built
    return None


def default_varlen_config(
    d: int, dtype: Dtype, causal: bool, variant: Variant = PLAIN
) -> AnyConfig | None:
    """FlashAttention-2's default config for ``d`` as a packed-sequence (``_vl``) kernel, with
    ``variant``'s switches set; None when the family's kernels do not take them.

    Raises:
        ValueError: ``d`` is not a FlashAttention-2 head dim.
    """
    config = family("fa2").default(d, dtype, causal)
    assert isinstance(config, Fa2Config)  # the fa2 family's default is its own config type
    return with_variant(replace(config, varlen=True), variant)[0]


def _variant_refusal(call: Call) -> str:
    """Why no default serves ``call``'s variant: the families' own reasons."""
    v = call.variant
    if call.packed is not None:
        base = family("fa2").default(call.d, call.dtype, call.causal)
        reasons = [with_variant(replace(cast(Any, base), varlen=True), v)[1]]
    else:
        limit = smem_limit_of(call.compute_capability)
        candidates = _default_candidates(call.d, call.dtype, call.causal, call.shape,
                                         call.sm_count, limit)  # fmt: skip
        reasons = [with_variant(c, v)[1] for c in candidates]
    why = "; ".join(dict.fromkeys(r for r in reasons if r))
    return f"no kernel serves the variant ({v.describe()}): {why or 'no family builds it'}"


def serves_variant(config: AnyConfig, variant: Variant) -> bool:
    """Whether ``config`` is built with exactly ``variant``'s switches (a stored answer is
    checked: a config of another variant would compute another function)."""
    switches = getattr(config, "variant_switches", {})
    return all(bool(switches.get(name, False)) == on for name, on in variant.needs.items())


def check_supported(dtype: str, d: int, compute_capability: str, *, packed: bool = False) -> None:
    """Refuse what no family serves: a dtype, a head dim (of a packed batch's kernels with
    ``packed``) or a GPU fa2tune builds nothing for.

    Raises:
        Unsupported: naming which.
    """
    if dtype not in DTYPE_NAMES.values():
        raise Unsupported(f"dtype {dtype} is not fp16 or bf16")
    if d not in (VARLEN_HEAD_DIMS if packed else SUPPORTED_HEAD_DIMS):
        raise Unsupported(unsupported_head_dim(d, packed))
    if arch_of(compute_capability) is None:
        raise Unsupported(
            f"no fa2tune build runs on compute capability {compute_capability}: its builds "
            f"are machine code for {', '.join(SUPPORTED_ARCHS)}, each of which runs only on "
            "GPUs of its own major version"
        )


def choose(store: Store | None, call: Call) -> Choice:
    """The config for a call of either mode on this GPU: the store's answer (exact, else the
    nearest tuned shape of the call's mode) when its family builds here, else the default.

    Args:
        store: the database to ask (shipped results already loaded), or None for the default
            only (no database could be opened, or ``off`` mode).
        call: the call (``compute_capability``: a tuned config whose family does not build
            for it is passed over; fa3 needs exactly 9.0).

    Raises:
        Unsupported: an unsupported head dim or dtype, a GPU fa2tune builds nothing for, or
            no default that builds here.
    """
    packed = call.packed
    cc = call.compute_capability
    variant = call.variant
    check_supported(call.dtype, call.d, cc, packed=packed is not None)
    # The default first (pure, cheap), so that the store's answer is the last thing asked.
    default = (
        default_varlen_config(call.d, call.dtype, call.causal, variant)
        if packed is not None
        else default_config(
            call.d, call.dtype, call.causal, call.shape, call.sm_count, variant, smem_limit_of(cc)
        )
    )
    built = default is not None  # a family builds the variant (before the GPU is asked)
    if default is not None and family_of(default).arch_for(cc) is None:
        default = None
    found = None
    if store is not None:
        try:
            found = candidates_of(store, call).match(call.gpu, call.causal, call.shape,
                                                     packed=packed, variant=variant)  # fmt: skip
        except Exception as exc:  # a broken database must not break the model: defaults
            log.warning("fa2tune.torch: database lookup failed, using defaults: %s", exc)
    if found is not None:
        best, config = found.result, found.result.config
        mode_fits = bool(getattr(config, "varlen", False)) == (packed is not None)
        fits = mode_fits and (variant.plain or serves_variant(config, variant))
        if fits and family_of(config).arch_for(cc) is not None:
            return Choice(config, "exact" if best.exact else "nearest", found.measured)
    if default is None:
        if not built and not variant.plain:
            raise Unsupported(_variant_refusal(call))
        raise Unsupported(
            f"no varlen kernel builds for compute capability {cc}"
            if packed is not None
            else f"no kernel family serves head dim {call.d} on compute capability {cc}"
        )
    return Choice(default, "default")


#: Candidate sets read from a store, by (store, GPU name key, D, dtype, served mask, packed,
#: switches). Bounded by the groups a process calls: a few per model.
_groups: dict[tuple[object, ...], CandidateSet] = {}
_groups_lock = threading.Lock()


def candidates_of(
    store: Store,
    call: Call,
    kv_page: int | None = None,
    family: str | None = None,
    kv_lengths: str = "full",
) -> CandidateSet:
    """The store's candidates for ``call``'s group, read on the group's first call only
    (``kv_page``: the cache problems of that layout, for a call over a KV cache, and
    ``kv_lengths`` their length pattern, :mod:`core.kv_lengths`; ``family``: only that
    family's builds)."""
    mask = served_mask(call.causal, call.shape, call.packed)
    needs = call.variant.needs
    key = (store, normalize_gpu_name(call.gpu), call.d, call.dtype, mask, call.packed is not None,
           tuple(sorted(needs.items())), kv_page, family, kv_lengths)  # fmt: skip
    group = _groups.get(key)
    if group is None:
        with _groups_lock:  # one read per group, however many threads ask at once
            group = _groups.get(key)
            if group is None:
                packed = call.packed is not None
                group = store.candidate_set(
                    call.gpu, call.d, call.dtype, mask, packed=packed, needs=needs,
                    kv_page=kv_page, family=family, kv_lengths=kv_lengths,
                )  # fmt: skip
                _groups[key] = group
    return group


def forget_results() -> None:
    """Read the store again on the next call of each group (results were written)."""
    with _groups_lock:
        _groups.clear()


def default_choice(call: Call) -> Choice:
    """The default of :func:`choose` (what serves when nothing tuned can).

    Raises:
        Unsupported: no family serves the head dim on this GPU.
    """
    return choose(None, call)


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
    """:func:`choose` for a dense call given by its values (``fa2tune best``'s rule, then a
    default); ``causal`` is taken as given.

    Raises:
        Unsupported: an unsupported head dim or dtype, or a GPU fa2tune builds nothing for.
    """
    check_supported(dtype, d, compute_capability)
    typed: Dtype = "fp16" if dtype == "fp16" else "bf16"
    call = Call(0, gpu, sm_count, compute_capability, shape, typed, causal, d)
    return choose(store, call)


def call_reason(
    *,
    device_type: str,
    dtype: str,
    d: int,
    ndim: int = 4,
    requires_grad: bool = False,
    packed: bool = False,
) -> str | None:
    """Why a call's tensors cannot go to the kernels (None when they can, as far as tensors
    alone tell: the GPU, the build and the strides are checked later).

    Args:
        device_type: ``q.device.type`` (``"cuda"``, ``"cpu"``).
        dtype: the torch dtype's name (``"float16"``, ``"float32"``).
        d: head dim.
        ndim: the tensors' number of dimensions (dense calls: 4).
        requires_grad: gradients are recorded for the call (the kernels are forward-only).
        packed: a packed batch (3-d tensors; the packed kernels' head dims).
    """
    if device_type != "cuda":
        return f"tensors on {device_type}, not on a CUDA device"
    if not packed and ndim != 4:
        return f"{ndim}-d tensors (the kernels take 4-d)"
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype} (the kernels take float16 and bfloat16)"
    if d not in (VARLEN_HEAD_DIMS if packed else SUPPORTED_HEAD_DIMS):
        return unsupported_head_dim(d, packed)
    if requires_grad:
        return "gradients are recorded (the kernels are forward-only)"
    return None


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
    variant: Variant = PLAIN,
) -> tuple[object, ...]:
    """The key the op caches a packed call's decision by: (device, dtype, D, Hq, Hkv,
    effective causal, number of sequences, :func:`mean_bucket`), and the normalised
    ``variant`` when it is not plain (a plain call's key is what it always was). The number
    of sequences is kept exact (it is bounded by a server's batch size, so it adds few keys);
    the launch geometry, which also depends on ``max_seqlen_q``, is worked out per call and is
    not part of the key."""
    key = (device, dtype, d, heads, kv_heads, effective_varlen_causal(causal, max_seqlen_q),
           count, mean_bucket(total_q, count))  # fmt: skip
    return key if variant is PLAIN or variant.plain else (*key, variant)


@lru_cache(maxsize=4096)
def normalize_call(
    causal: bool,
    window_left: int,
    window_right: int,
    chunk: int,
    softcap: float,
    sinks: bool,
    nq: int,
    nk: int,
    packed: bool = False,
) -> tuple[bool, Variant]:
    """A call's ``(causal, variant)`` as the store and the kernels take it
    (:func:`core.variant.normalize` with the call's lengths), cached: a serving loop asks
    the same few variants and lengths again and again.

    ``nq``, ``nk``: a dense call's lengths; a packed batch's longest ones (``packed``). A
    bound that reaches past the longest sequence reaches past every sequence, so the window
    rules hold for a batch as for one call; the chunk rule (a chunk holding every key is no
    chunk) needs every sequence to have at least as many keys as queries, which the longest
    lengths do not tell, so a packed batch keeps its chunk (``nq`` is raised past ``nk`` for
    that rule only where the chunk reaches past ``nk``; a longer ``nq`` only keeps bounds).

    Raises:
        core.variant.VariantError: an argument out of its domain (the message names it).
    """
    if packed and chunk > 0 and chunk >= nk:
        nq = max(nq, nk + 1)
    return normalize(causal, window_left, window_right, chunk, nq=nq, nk=nk,
                     softcap=softcap, sinks=sinks)  # fmt: skip


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
    forget_results()
    with _store_lock:
        if _store and _store[0] is not None:
            _store[0].close()
        _store.clear()
