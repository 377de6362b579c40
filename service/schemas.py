"""Request and response models of the HTTP API (separate from the ORM models in ``db``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from core.family import AnyConfig
from core.kv_lengths import KvLengths
from core.shape import Shape
from core.variant import Variant
from db.results import BestResult, GpuSummary, ResultRow


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ErrorOut(_Out):
    """An error with a human-readable reason."""

    detail: str = Field(examples=["no results for GPU 'RTX 9090'; GPUs with results: NVIDIA H200"])


class FieldError(_Out):
    """One invalid input."""

    loc: list[str | int] = Field(description="where: e.g. ['query', 'd']")
    msg: str
    input: object | None = None


class ValidationErrorOut(_Out):
    """422: the request's parameters or body are invalid; ``detail`` says which and why."""

    detail: str = Field(examples=["d: must be a multiple of 8 from 8 to 256 (got 12)"])
    errors: list[FieldError] = Field(default_factory=list)


class ConfigOut(_Out):
    """A kernel config: its family, every template parameter and derived launch figures.

    ``params`` holds the family's own parameters; for the ``fa2`` family they are also given
    flat (``br`` ... ``swizzle``), as before kernel families existed, and are null otherwise.
    """

    name: str = Field(description='readable id, also the kernel\'s extern "C" symbol')
    key: str = Field(description="stable 16-hex-digit key")
    family: str = Field(description="kernel family (the name's prefix), e.g. fa2")
    d: int
    dtype: Literal["fp16", "bf16"]
    causal: bool
    params: dict[str, int | bool | str] = Field(description="the family's own parameters")
    br: int | None = Field(default=None, description="fa2: query rows per thread block")
    bc: int | None = Field(default=None, description="fa2: key/value rows per tile")
    warps: int | None = Field(default=None, description="fa2: warps per block")
    stages: int | None = Field(default=None, description="fa2: K/V shared-memory buffers each")
    pad: int | None = Field(default=None, description="fa2: halfs of padding per smem row")
    swizzle: bool | None = Field(default=None, description="fa2: swizzled smem layout")
    threads: int
    smem_bytes: int = Field(description="dynamic shared memory per block")

    @classmethod
    def of(cls, c: AnyConfig) -> ConfigOut:
        params = c.params()
        flat = params if c.spec.flat_params else {}  # the first family's, from before families
        return cls(
            name=c.name, key=c.key, family=c.family, d=c.d, dtype=c.dtype, causal=c.causal,
            params=params, threads=c.threads, smem_bytes=c.smem_bytes, **flat,
        )  # fmt: skip


def _absent(value: object) -> bool:
    return value is None


class VariantOut(_Out):
    """An attention variant (core.variant), in FlashAttention's normal form: a causal
    call's window right bound is 0, a bound past every key is none (-1)."""

    window_left: int = Field(description="keys this far left of a query's position; -1: none")
    window_right: int = Field(description="keys this far right; -1: none")
    chunk: int = Field(description="chunked attention's chunk; 0: none")
    softcap: float = Field(description="logit softcap; 0: none")
    sinks: bool = Field(description="attention sinks")

    @classmethod
    def of(cls, v: Variant) -> VariantOut | None:
        """The variant, or None (left out of an answer) when it is plain."""
        if v.plain:
            return None
        return cls(window_left=v.window_left, window_right=v.window_right, chunk=v.chunk,
                   softcap=v.softcap, sinks=v.sinks)  # fmt: skip


class MeasuredProblemOut(_Out):
    """The full shape the winning measurement was taken on (and its variant, when any)."""

    n: int
    nk: int
    batch: int
    heads: int
    kv_heads: int
    variant: VariantOut | None = Field(
        default=None,
        exclude_if=_absent,
        description="the attention variant the measured problem was tuned for (its window "
        "and chunk may be the nearest tuned to the asked ones); absent when plain",
    )
    kv_page: int | None = Field(
        default=None,
        exclude_if=_absent,
        description="the KV-cache layout the measured problem was timed on (the asked one); "
        "absent for a dense problem",
    )
    kv_lengths: KvLengths | None = Field(
        default=None,
        exclude_if=_absent,
        description="the length pattern the measured cache problem was timed on: full, every "
        "sequence at the capacity nk; mixed, a fixed spread up to it; absent for a dense "
        "problem",
    )


class ShapeOut(_Out):
    """The call shape asked for (with the defaults filled in)."""

    nq: int = Field(description="query rows per (batch, head)")
    nk: int = Field(description="key rows per (batch, KV head)")
    batch: int
    heads: int = Field(description="query heads")
    kv_heads: int = Field(description="key/value heads (heads is a multiple)")

    @classmethod
    def of(cls, shape: Shape) -> ShapeOut:
        return cls(
            nq=shape.nq, nk=shape.nk, batch=shape.batch, heads=shape.heads, kv_heads=shape.kv_heads
        )


class BuildOut(_Out):
    """ptxas's resource report of the winning build."""

    registers: int | None
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int

    @classmethod
    def of(cls, b: BestResult) -> BuildOut:
        return cls(
            registers=b.registers,
            spill_stores=b.spill_stores,
            spill_loads=b.spill_loads,
            stack_bytes=b.stack_bytes,
            static_smem=b.static_smem,
        )


class ProvenanceOut(_Out):
    """Where and how the winning figure was measured."""

    gpu: str = Field(description="device name as the driver reports it")
    compute_capability: str
    driver_version: str
    cuda_version: str
    nvcc_version: str
    arch: str = Field(examples=["sm_90"])
    source_hash: str = Field(description="hash of template + instantiation + flags + nvcc + arch")
    measured_at: datetime
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None

    @classmethod
    def of(cls, b: BestResult) -> ProvenanceOut:
        return cls(
            gpu=b.gpu,
            compute_capability=b.compute_capability,
            driver_version=b.driver_version,
            cuda_version=b.cuda_version,
            nvcc_version=b.nvcc_version,
            arch=b.arch,
            source_hash=b.source_hash,
            measured_at=b.measured_at,
            sm_clock_mhz=b.sm_clock_mhz,
            mem_clock_mhz=b.mem_clock_mhz,
        )


def _measured_fields(b: BestResult) -> dict[str, Any]:
    """The fields /v1/best and /v1/best/varlen answers share: the config, its measurement,
    build and provenance."""
    return {
        "gpu": b.gpu,
        "d": b.d,
        "dtype": b.config.dtype,
        "causal": b.causal,
        "config": ConfigOut.of(b.config),
        "median_ms": b.median_ms,
        "p10_ms": b.p10_ms,
        "p90_ms": b.p90_ms,
        "tflops": b.tflops,
        "max_abs_err": b.max_abs_err,
        "rel_err": b.rel_err,
        "build": BuildOut.of(b),
        "provenance": ProvenanceOut.of(b),
    }


def _measured_lengths(kv_page: int | None, kv_lengths: str) -> KvLengths | None:
    """A measured problem's length pattern as answers show it: a cache problem's, whichever it
    is (a client that left the pattern to the service learns which answered); None, left out,
    for a dense one (it has none)."""
    # The store holds patterns of core.kv_lengths only; the model checks it all the same.
    return None if kv_page is None else cast(KvLengths, kv_lengths)


class BestOut(_Out):
    """The fastest correct config for a shape on a GPU."""

    n: int = Field(description="the N (with a shape: the Nq) asked for")
    exact: bool = Field(
        description="true when measured at exactly this N (with a shape: this whole shape)"
    )
    from_n: int = Field(
        description="the N (Nq) the answer was measured at: the nearest tuned N on a log "
        "scale, or with a shape the Nq of the nearest tuned shape"
    )
    # Absent, not null, on an answer for N alone, so old clients get the bodies they always got.
    shape: ShapeOut | None = Field(
        default=None,
        exclude_if=_absent,
        description="the shape asked for, defaults filled in; only when a shape parameter "
        "(nq, nk, batch, heads, kv_heads) was given",
    )
    distance: float | None = Field(
        default=None,
        exclude_if=_absent,
        description="how far measured_problem is from shape (0 when exact): the sum of "
        "|log ratio| of Nq, Nk, grid fill and GQA group; only with shape",
    )
    variant: VariantOut | None = Field(
        default=None,
        exclude_if=_absent,
        description="the attention variant answered for (the asked one, normalised); absent "
        "for plain attention. A variant's answer is always a shape answer",
    )
    kv_page: int | None = Field(
        default=None,
        exclude_if=_absent,
        description="the KV-cache layout answered for (0 contiguous, P paged), from problems "
        "tuned on cache kernels of that layout; absent for a dense call. A cache answer is "
        "always a shape answer",
    )
    kv_lengths: KvLengths | None = Field(
        default=None,
        exclude_if=_absent,
        description="with kv_page, the length pattern of the problems that answered: the "
        "asked one, else the op's pick (mixed where any of the layout answers, else full); "
        "absent for a dense call",
    )
    gpu: str
    d: int
    dtype: Literal["fp16", "bf16"]
    causal: bool
    config: ConfigOut
    median_ms: float = Field(description="median kernel time per launch at from_n")
    p10_ms: float | None
    p90_ms: float | None
    tflops: float | None = Field(description="throughput at from_n")
    max_abs_err: float | None = Field(description="vs. a float32 reference")
    rel_err: float | None
    measured_problem: MeasuredProblemOut
    build: BuildOut
    provenance: ProvenanceOut

    @classmethod
    def of(
        cls,
        b: BestResult,
        n: int,
        shape: Shape | None = None,
        variant: Variant | None = None,
        kv_page: int | None = None,
        *,
        kv_lengths: KvLengths | None = None,
    ) -> BestOut:
        """The answer to a request for ``n`` alone, or (``shape``) for a whole shape, of
        ``variant`` when one was asked (a plain one is left out), over a KV cache of
        ``kv_page``'s layout when one was asked, answered by the problems of ``kv_lengths``'
        pattern (a cache answer's; None for a dense one)."""
        return cls(
            n=n if shape is None else shape.nq,
            exact=n == b.n if shape is None else b.exact,
            shape=None if shape is None else ShapeOut.of(shape),
            distance=None if shape is None else b.distance,
            variant=None if variant is None else VariantOut.of(variant),
            kv_page=kv_page,
            kv_lengths=kv_lengths,
            from_n=b.n,
            **_measured_fields(b),
            measured_problem=MeasuredProblemOut(
                n=b.n, nk=b.nk, batch=b.batch, heads=b.heads, kv_heads=b.kv_heads,
                variant=VariantOut.of(b.variant), kv_page=b.kv_page,
                kv_lengths=_measured_lengths(b.kv_page, b.kv_lengths),
            ),
        )  # fmt: skip


class VarlenBestOut(_Out):
    """The fastest correct varlen config for a packed batch of sequences on a GPU."""

    seqlens: list[int] = Field(description="the lengths asked for")
    exact: bool = Field(description="true when measured on exactly these lengths and heads")
    measured_seqlens: list[int] = Field(description="the lengths the answer was measured on")
    heads: int
    kv_heads: int
    distance: float = Field(
        description="how far the measured batch is from the asked one (0 when exact): "
        "core.shape's distance between the two as their count of sequences at the mean length"
    )
    variant: VariantOut | None = Field(
        default=None,
        exclude_if=_absent,
        description="the attention variant answered for (normalised); absent when plain",
    )
    measured_variant: VariantOut | None = Field(
        default=None,
        exclude_if=_absent,
        description="the variant measured_seqlens were tuned for; absent when plain",
    )
    gpu: str
    d: int
    dtype: Literal["fp16", "bf16"]
    causal: bool
    config: ConfigOut
    median_ms: float = Field(description="median kernel time per launch on measured_seqlens")
    p10_ms: float | None
    p90_ms: float | None
    tflops: float | None = Field(description="throughput on measured_seqlens (summed work)")
    max_abs_err: float | None = Field(description="vs. a float32 reference, every sequence")
    rel_err: float | None
    build: BuildOut
    provenance: ProvenanceOut

    @classmethod
    def of(
        cls,
        b: BestResult,
        asked: Sequence[int],
        measured: Sequence[int],
        variant: Variant | None = None,
    ) -> VarlenBestOut:
        return cls(
            variant=None if variant is None else VariantOut.of(variant),
            measured_variant=VariantOut.of(b.variant),
            seqlens=list(asked),
            exact=b.exact,
            measured_seqlens=list(measured),
            heads=b.heads,
            kv_heads=b.kv_heads,
            distance=b.distance,
            **_measured_fields(b),
        )


class TunedSetOut(_Out):
    """The Ns tuned for one (D, dtype, causal) on a GPU."""

    d: int
    dtype: Literal["fp16", "bf16"]
    causal: bool
    ns: list[int]


class GpuOut(_Out):
    """A GPU in the database and what is tuned for it."""

    name: str
    compute_capability: str
    sm_count: int
    driver_version: str = Field(description="latest seen")
    cuda_version: str = Field(description="latest seen")
    memory_bytes: int
    smem_optin_bytes: int
    l2_bytes: int = Field(description="L2 cache in bytes; 0 where not read")
    measurements: int
    ok_measurements: int
    tuned: list[TunedSetOut]

    @classmethod
    def of(cls, g: GpuSummary, tuned: list[TunedSetOut]) -> GpuOut:
        return cls(**g.to_dict(), tuned=tuned)


class GpuListOut(_Out):
    """Every GPU in the database."""

    items: list[GpuOut]


class ResultOut(_Out):
    """One measurement with its problem, GPU and build."""

    measurement_id: int
    gpu: str
    compute_capability: str
    d: int
    n: int
    nk: int
    batch: int
    heads: int
    kv_heads: int
    dtype: str
    causal: bool
    config_name: str
    family: str = Field(description="kernel family of the config (the name's prefix)")
    config_key: str
    arch: str
    source_hash: str
    registers: int | None
    spill_stores: int
    spill_loads: int
    status: str
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    tflops: float | None
    max_abs_err: float | None
    rel_err: float | None
    error: str | None
    trial_number: int | None
    driver_version: str
    cuda_version: str
    measured_at: datetime
    # The problem's attention variant: present only when it is not plain.
    window_left: int | None = Field(default=None, exclude_if=_absent)
    window_right: int | None = Field(default=None, exclude_if=_absent)
    chunk: int | None = Field(default=None, exclude_if=_absent)
    softcap: float | None = Field(default=None, exclude_if=_absent)
    sinks: bool | None = Field(default=None, exclude_if=_absent)
    # The problem's KV-cache layout: present only for a cache problem.
    kv_page: int | None = Field(
        default=None, exclude_if=_absent,
        description="the KV-cache layout the problem was timed on: 0 a contiguous cache, P a "
        "paged cache of P-token pages; absent for a dense problem",
    )  # fmt: skip
    kv_lengths: KvLengths | None = Field(
        default=None, exclude_if=_absent,
        description="the length pattern a cache problem was timed on: full, every sequence at "
        "the capacity nk; mixed, a fixed spread up to it; absent for a dense problem",
    )  # fmt: skip

    @classmethod
    def of(cls, r: ResultRow) -> ResultOut:
        data = r.to_dict()
        # The row's dict leaves a full pattern out; a cache row shows it either way, as
        # /v1/best's answers do.
        data["kv_lengths"] = _measured_lengths(r.kv_page, r.kv_lengths)
        return cls(**data)


class ResultPageOut(_Out):
    """A page of measurements (fastest first within a problem)."""

    total: int = Field(description="rows matching the filters")
    offset: int
    limit: int
    next_offset: int | None = Field(description="offset of the next page; null on the last")
    items: list[ResultOut]


class IngestOut(_Out):
    """What an ingest did; re-posting the same file adds nothing."""

    added: int = Field(description="measurements added")
    skipped: int = Field(description="measurements already present")
    gpus_added: int
    builds_added: int
    problems_added: int


class IndexStatsOut(_Out):
    """The in-memory index of best configs."""

    gpus: int
    tuned_problems: int
    built_at: datetime


class HealthOut(_Out):
    """Liveness."""

    status: Literal["ok"] = "ok"
    version: str
    index: IndexStatsOut
