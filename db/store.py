"""The typed query layer every other stage uses: record builds and measurements, ask for the best.

Writers (the tuner's workers) and readers (the service, the CLI) share one :class:`Store` API,
a thin facade over an engine. Its methods are the documented contract; the work is done by
module-level functions split by job:

- :mod:`db.writes`: the write side (``upsert_gpu``, ``record_build``, ``problem_id``,
  ``record_measurement``), each in its own write transaction;
- :mod:`db.queries`: the lookups (``best``, ``best_or_nearest``, ``best_for_shape`` and its
  packed-batch mode ``best_varlen``/``best_varlen_shape``, ``shape_winners``,
  ``varlen_winners``, ``measured_pairs``, ``outcome``, ``spill_bytes``), read-only;
- :mod:`db.listing`: the listings (``gpus``, ``results``), read-only;
- :mod:`db.results`: the values the reads return (:class:`~db.results.BestResult`,
  :class:`~db.results.GpuSummary`, :class:`~db.results.ResultPage`,
  :class:`~db.results.ResultRow`, :class:`~db.results.StoredOutcome`, ``MAX_PAGE``).

All SQL lives in those modules and in :mod:`db.transfer`. ``normalize_gpu_name`` is
re-exported here as the rule the store keys GPUs on (``gpus.name_key``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from sqlalchemy import Engine

from core.build_report import BuildReport
from core.gpu_name import normalize_gpu_name
from core.kv_lengths import CALL_ORDER, answering_pattern
from core.lookup import Packed
from core.problem import Problem as ProblemSpec
from core.records import GpuInfo, MeasureResult
from core.shape import Shape
from core.variant import PLAIN, Variant
from db import listing, queries, writes
from db.results import BestResult, GpuSummary, ResultPage, StoredOutcome
from db.session import init_db, make_engine

__all__ = ["Store", "normalize_gpu_name"]


class Store:
    """Typed access to the results database.

    Args:
        engine: an engine from :func:`db.session.make_engine` whose schema is at head
            (see :meth:`from_url` or :func:`db.session.init_db`).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @classmethod
    def from_url(cls, url: str, *, migrate: bool = True) -> Store:
        """Open the database at ``url``, migrating its schema to head unless ``migrate=False``."""
        engine = make_engine(url)
        if migrate:
            init_db(engine)
        return cls(engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Release the engine's pooled connections."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---------------------------------------------------------------- writes

    def upsert_gpu(self, info: GpuInfo) -> int:
        """Record a GPU (or refresh its latest driver/CUDA/memory facts) and return its id."""
        return writes.upsert_gpu(self._engine, info)

    def record_build(self, report: BuildReport) -> int:
        """Record a build and return its id; the same (config, arch, source hash) is one row.

        Recording the same identity again updates the row to the newer report (a rebuild
        after a transient nvcc failure corrects the status) and returns the same id.
        """
        return writes.record_build(self._engine, report)

    def problem_id(self, problem: ProblemSpec, gpu_id: int) -> int:
        """The id of ``problem`` on GPU ``gpu_id``, created when new (its shape, variant,
        KV-cache layout and length pattern are its identity).

        ``problem.gpu`` is not consulted: the GPU is ``gpu_id`` (from :meth:`upsert_gpu`).
        """
        return writes.problem_id(self._engine, problem, gpu_id)

    def record_measurement(
        self,
        problem_id: int,
        build_id: int,
        result: MeasureResult,
        gpu: GpuInfo,
        trial_number: int | None = None,
    ) -> int:
        """Append one measurement and return its id.

        Args:
            problem_id: from :meth:`problem_id`.
            build_id: from :meth:`record_build`.
            result: what the worker measured.
            gpu: the device's state at measurement time (driver, CUDA, clocks are kept).
            trial_number: the optuna trial, when the search produced it.

        Raises:
            ValueError: unknown problem or build, a build whose config does not fit the
                problem (head dim, dtype, causality, the switches of its attention variant), or
                an OK result without a median time.
        """
        return writes.record_measurement(
            self._engine, problem_id, build_id, result, gpu, trial_number
        )

    # ----------------------------------------------------------------- reads

    def measured_pairs(self, problem_id: int) -> set[str]:
        """Config keys already measured (any status) for a problem: what a resume skips."""
        return queries.measured_pairs(self._engine, problem_id)

    def outcome(self, problem_id: int, config_key: str) -> StoredOutcome:
        """The stored outcome of one config on one problem: the fastest OK, else the latest.

        A resumed campaign hands this to the sampler instead of measuring again
        (:meth:`measured_pairs` gives the keys only).

        Returns:
            The status and median time; ``("SKIPPED", None)`` when nothing is stored.
        """
        return queries.outcome(self._engine, problem_id, config_key)

    def spill_bytes(self, config_key: str) -> int:
        """The largest spill (stores or loads, bytes per thread) of a config's stored builds;
        0 when none is stored."""
        return queries.spill_bytes(self._engine, config_key)

    def best(
        self,
        gpu: str,
        d: int,
        n: int,
        dtype: str = "fp16",
        causal: bool = False,
        *,
        nk: int | None = None,
        batch: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
        family: str | None = None,
    ) -> BestResult | None:
        """The fastest correct (status OK) config measured for exactly this problem.

        Args:
            gpu: GPU name as users write it (``"H200"``, ``"NVIDIA H200"``).
            d: head dimension.
            n: query length (and key length unless ``nk`` is given).
            dtype: ``"fp16"`` or ``"bf16"``.
            causal: causal masking.
            nk: key length; None means square problems (``nk == n``).
            batch, heads, kv_heads: restrict to these; None accepts any (ranked by
                throughput across them).
            family: only this kernel family's builds (None: any family).

        Returns:
            The winner, or None when no OK measurement exists for the problem.
        """
        return queries.best(
            self._engine,
            gpu,
            d,
            n,
            dtype,
            causal,
            nk=nk,
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
            family=family,
        )

    def best_or_nearest(
        self,
        gpu: str,
        d: int,
        n: int,
        dtype: str = "fp16",
        causal: bool = False,
        *,
        nk: int | None = None,
        batch: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
    ) -> BestResult | None:
        """:meth:`best`, or else the best at the nearest N tuned for this GPU/D/dtype/causal.

        Nearness is by ratio (``|log(N_tuned / n)|``) because tuned lengths are spaced
        geometrically; a tie goes to the larger N. The result then has ``exact=False``,
        ``from_n`` set to the N it was measured at and ``distance`` the shape distance from
        N x N (at the winner's batch and heads) to the measured problem.

        Returns:
            The exact or nearest result, or None when nothing OK was measured at any N.
        """
        return queries.best_or_nearest(
            self._engine,
            gpu,
            d,
            n,
            dtype,
            causal,
            nk=nk,
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
        )

    def best_for_shape(
        self,
        gpu: str,
        d: int,
        dtype: str,
        causal: bool,
        shape: Shape,
        *,
        exact: bool = False,
        family: str | None = None,
        variant: Variant = PLAIN,
        kv_page: int | None = None,
        kv_lengths: str = "full",
    ) -> BestResult | None:
        """The best config for a whole call shape: measured at it, else at the nearest tuned one.

        The candidates are this GPU/D/dtype/mask's problems with at least one OK
        measurement (of ``family``'s builds when given). A problem of exactly ``shape`` wins
        (``exact=True``, ``distance`` 0.0); otherwise, unless ``exact``, the one nearest
        under :func:`core.shape.nearest_shape` with the GPU's recorded SM count
        (:data:`db.queries.DEFAULT_SM_COUNT` when not positive). Within the chosen shape the
        fastest OK median wins. ``from_n``, ``nk``, ``batch``, ``heads`` and ``kv_heads``
        then say where the answer was measured and ``distance`` how far that is.

        ``variant`` (plain by default): only problems tuned with its switches, by configs
        built with them, answer; among those the same window and chunk, else the nearest
        (:func:`core.lookup.pick`); the result's ``variant`` says which it was measured for.

        ``kv_page`` (None by default: a dense call): a call over a KV cache of this layout
        (0 contiguous, P paged; :attr:`core.problem.Problem.kv_page`) is answered only by
        cache problems of the same layout, timed on cache kernels; a dense call never by
        one. The result's ``kv_page`` says which layout answered.

        ``kv_lengths`` (``full`` by default): with ``kv_page``, the length pattern the cache
        problems were timed on (:attr:`core.problem.Problem.kv_lengths`); only problems of
        that pattern answer, and the result's ``kv_lengths`` says it.

        Returns:
            The result, or None when nothing qualifies (with ``exact``: the shape itself was
            not tuned).

        Raises:
            ValueError: ``kv_lengths`` not a pattern, or ``mixed`` without ``kv_page``.
        """
        return queries.best_for_shape(
            self._engine, gpu, d, dtype, causal, shape, exact=exact, family=family,
            variant=variant, kv_page=kv_page, kv_lengths=kv_lengths,
        )  # fmt: skip

    def best_for_cache_call(
        self,
        gpu: str,
        d: int,
        dtype: str,
        causal: bool,
        shape: Shape,
        *,
        kv_page: int,
        kv_lengths: str | None = None,
        exact: bool = False,
        family: str | None = None,
        variant: Variant = PLAIN,
    ) -> BestResult | None:
        """:meth:`best_for_shape` of a call over a KV cache of layout ``kv_page``, by the
        problems of the length pattern ``kv_lengths``, or with None by what a call whose
        lengths are on the device runs (the op's and the exported header's rule,
        :func:`core.kv_lengths.answering_pattern`): the nearest problem of either pattern, a
        tie going to ``mixed``; with ``exact`` only problems at the shape count.

        Raises:
            ValueError: ``kv_lengths`` not a pattern.
        """
        patterns = CALL_ORDER if kv_lengths is None else (kv_lengths,)
        found = {
            pattern: self.best_for_shape(
                gpu,
                d,
                dtype,
                causal,
                shape,
                exact=exact,
                family=family,
                variant=variant,
                kv_page=kv_page,
                kv_lengths=pattern,
            )
            for pattern in patterns
        }
        nearest = {
            p: (r.distance, Shape(r.n, r.nk, r.batch, r.heads, r.kv_heads))
            for p, r in found.items() if r is not None
        }  # fmt: skip
        pattern = answering_pattern(nearest)
        return None if pattern is None else found[pattern]

    def best_match(
        self,
        gpu: str,
        d: int,
        dtype: str,
        causal: bool,
        shape: Shape,
        *,
        packed: Packed | None = None,
        exact: bool = False,
        family: str | None = None,
        variant: Variant = PLAIN,
        kv_page: int | None = None,
        kv_lengths: str = "full",
    ) -> queries.Match | None:
        """The one lookup of both modes: :meth:`best_for_shape` for a dense ``shape``
        (``packed`` None), or, for a packed batch (``shape`` its ``packed.shape(heads,
        kv_heads)``), the varlen problem measured on exactly ``packed.seqlens`` (when given)
        and these heads, else the nearest tuned varlen problem (each compared as its count
        of sequences at their mean length; ties: the first tuned). The answer carries the
        lengths a packed one was measured on; None when nothing of the mode qualifies.
        ``variant``, ``kv_page``, ``kv_lengths``: as :meth:`best_for_shape` (None when
        nothing of them is tuned; a packed batch with ``kv_page`` raises ValueError, as does
        a ``kv_lengths`` :meth:`best_for_shape` refuses).
        """
        return queries.best_match(
            self._engine, gpu, d, dtype, causal, shape, packed=packed, exact=exact,
            family=family, variant=variant, kv_page=kv_page, kv_lengths=kv_lengths,
        )  # fmt: skip

    def candidate_set(
        self,
        gpu: str,
        d: int,
        dtype: str,
        served_causal: bool,
        *,
        packed: bool = False,
        needs: dict[str, bool] | None = None,
        kv_page: int | None = None,
        family: str | None = None,
        kv_lengths: str = "full",
    ) -> queries.CandidateSet:
        """Every candidate :meth:`best_match` compares for one group (GPU, D, dtype, the
        served mask, mode, variant switches, KV-cache layout and length pattern; ``family``:
        only that family's builds), read once, to match many shapes in memory
        (:meth:`db.queries.CandidateSet.match` gives :meth:`best_match`'s answer; the set
        keeps its ``kv_lengths``).

        Raises:
            ValueError: a ``kv_lengths`` :meth:`best_for_shape` refuses.
        """
        return queries.candidate_set(self._engine, gpu, d, dtype, served_causal, packed=packed,
                                     family=family, needs=needs, kv_page=kv_page,
                                     kv_lengths=kv_lengths)  # fmt: skip

    def best_varlen(
        self,
        gpu: str,
        d: int,
        dtype: str,
        causal: bool,
        seqlens: Sequence[int],
        heads: int,
        kv_heads: int,
        *,
        variant: Variant = PLAIN,
    ) -> tuple[BestResult, tuple[int, ...]] | None:
        """The best varlen config for a packed batch of ``seqlens``: measured on exactly those
        lengths (and heads), else on the nearest tuned varlen problem (each compared as its
        count of sequences at their mean length, :func:`core.shape.varlen_shape`). Returns the
        result with the lengths it was measured on, or None when no varlen problem of this
        GPU, D, dtype and mask (and ``variant``, as :meth:`best_for_shape`) is tuned."""
        return queries.best_packed(
            self._engine, gpu, d, dtype, causal, Packed.of(seqlens), heads, kv_heads,
            variant=variant,
        )  # fmt: skip

    def best_varlen_shape(
        self,
        gpu: str,
        d: int,
        dtype: str,
        causal: bool,
        count: int,
        mean: int,
        heads: int,
        kv_heads: int,
        *,
        variant: Variant = PLAIN,
    ) -> tuple[BestResult, tuple[int, ...]] | None:
        """The best varlen config for a packed batch known only as ``count`` sequences of
        ``mean`` rows on average (``fa2tune.torch.attention_varlen`` does not read its offsets
        on the host): :meth:`best_varlen`'s nearest rule with the asked batch compared as
        ``count`` x ``mean``; never ``exact``. Returns the result with the lengths it was
        measured on, or None when no varlen problem of this GPU, D, dtype and mask is tuned.

        Raises:
            ValueError: ``count`` or ``mean`` below 1.
        """
        return queries.best_packed(
            self._engine, gpu, d, dtype, causal, Packed(count, mean), heads, kv_heads,
            variant=variant,
        )  # fmt: skip

    def varlen_winners(
        self, gpu: str, families: Sequence[str] | None = None
    ) -> list[tuple[BestResult, tuple[int, ...]]]:
        """The winner of every tuned varlen problem of ``gpu`` (any D, dtype and mask), among
        ``families`` when given, with the lengths it was measured on, in problem-id order:
        what the exported header's packed-batch tables hold."""
        return queries.varlen_winners(self._engine, gpu, families)

    def variant_winners(
        self,
        gpu: str,
        families: Sequence[str] | None = None,
        packed_families: Sequence[str] | None = None,
    ) -> list[tuple[BestResult, tuple[int, ...] | None]]:
        """The winner of every problem of ``gpu`` tuned with an attention variant (any D,
        dtype, mask and mode), by a build with the problem's switches (among ``families``
        for dense problems and ``packed_families`` for packed ones, when given), each with
        the lengths a packed problem was measured on (None: dense), in problem-id order:
        what the exported header's variant tables hold. The results carry their variant."""
        return queries.variant_winners(self._engine, gpu, families, packed_families)

    def cache_winners(self, gpu: str, families: Sequence[str] | None = None) -> list[BestResult]:
        """The winner of every KV-cache problem (``kv_page`` set: contiguous or paged) of
        plain attention tuned for ``gpu``, by a build of the problem's cache layout (among
        ``families`` when given), in problem-id order: what the exported header's tuned
        KV-cache entries hold. Both length patterns' problems are listed (a shape and layout
        tuned on ``full`` and on ``mixed`` lengths gives two results); the results carry
        their ``kv_page`` and ``kv_lengths``."""
        return queries.cache_winners(self._engine, gpu, families)

    def shape_winners(self) -> list[tuple[BestResult, int]]:
        """The winner of every tuned problem (any shape, any family), each with its GPU's SM
        count as :meth:`best_for_shape` uses it; what the service's shape index holds.

        One result per (GPU name, D, dtype, causal, shape): GPU rows that share a name (by
        :func:`normalize_gpu_name`) count as one GPU, as :meth:`best_for_shape` treats them.
        """
        return queries.shape_winners(self._engine)

    def gpus(self) -> list[GpuSummary]:
        """Every GPU in the database with its measurement counts, by name."""
        return listing.gpus(self._engine)

    def results(
        self,
        gpu: str | None = None,
        d: int | None = None,
        n: int | None = None,
        *,
        dtype: str | None = None,
        causal: bool | None = None,
        status: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> ResultPage:
        """Measurements matching the filters, a page at a time.

        Rows are ordered by GPU, problem, then fastest first (failures, which have no time,
        last), so pages are stable.

        Args:
            gpu, d, n, dtype, causal, status: filters; None means any.
            offset: rows to skip (>= 0).
            limit: rows per page (1 .. 1000).

        Raises:
            ValueError: offset or limit out of range.
        """
        return listing.results(
            self._engine,
            gpu,
            d,
            n,
            dtype=dtype,
            causal=causal,
            status=status,
            offset=offset,
            limit=limit,
        )
