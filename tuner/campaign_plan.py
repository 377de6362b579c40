"""The problems of a campaign, planned from ``fa2tune tune``'s shape options and workloads.

:class:`ShapeOptions` holds the shape options as given (None: not given). On the GPU the
campaign is every combination of the lists (the defaults fill in what is not given), then
the workload file's problems, each once (:func:`campaign_targets`); in replay the table's
problems are the campaign and the options only select among them (:func:`replay_problems`).
The attention-variant options (``--window``, ``--chunk``, ``--softcap``, ``--sinks``) apply to
every problem of the grid, each normalised with its lengths (:func:`core.variant.normalize`:
a window past every key is none); a workload entry sets its own. ``--kv-page`` (a list of
KV-cache layouts: 0 contiguous, P paged) makes every problem of the grid a cache problem of
each layout (:attr:`core.problem.Problem.kv_page`), tuned on the cache kernels;
``--kv-lengths`` (``full``, ``mixed`` or both) gives those problems their length patterns
(:attr:`core.problem.Problem.kv_lengths`), so it needs ``--kv-page`` (in replay it only
selects, as every option does). Bad values and combinations raise
:class:`typer.BadParameter` naming the option (exit status 2), as the value parsers of
:mod:`tuner.cli_values` do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from core.config import Dtype
from core.problem import Problem
from core.shape import Shape
from core.shape_request import ShapeParamError, parse_window, resolve_variant
from core.variant import PLAIN, Variant
from tuner.cli_values import (
    bad_option,
    parse_bool_list,
    parse_dtypes,
    parse_head_dims,
    parse_int_list,
    parse_kv_lengths,
    parse_kv_pages,
)
from tuner.workload import Target, WorkloadError, load_workload, unique_targets

if TYPE_CHECKING:
    from tuner.replay_table import ReplayTable

log = logging.getLogger(__name__)

DEFAULT_D: Final = "64,128"
DEFAULT_N: Final = "512,1024,2048,4096,8192,16384"
DEFAULT_DTYPE: Final = "fp16"
DEFAULT_CAUSAL: Final = "no,yes"
DEFAULT_BATCH: Final = "2"
DEFAULT_HEADS: Final = "16"
T = TypeVar("T")


@dataclass(frozen=True)
class ShapeOptions:
    """The problem options as given on the command line (None: not given).

    Attributes:
        d, n, nq, nk, dtype, causal, batch, heads, kv_heads: the comma-separated lists.
        workloads: the ``--workload`` files (the option repeats), in order.
        window, window_left, window_right, chunk, softcap, sinks: the attention variant of
            the grid's problems (``--window LEFT,RIGHT`` or its two halves).
        kv_page: the KV-cache layouts of the grid's problems (``--kv-page 0,16``; None: dense).
        kv_lengths: the length patterns of the grid's cache problems (``--kv-lengths mixed``;
            None: ``full``).
    """

    d: str | None = None
    n: str | None = None
    nq: str | None = None
    nk: str | None = None
    dtype: str | None = None
    causal: str | None = None
    batch: str | None = None
    heads: str | None = None
    kv_heads: str | None = None
    workloads: tuple[Path, ...] = ()
    window: str | None = None
    window_left: int | None = None
    window_right: int | None = None
    chunk: int | None = None
    softcap: float | None = None
    sinks: bool = False
    kv_page: str | None = None
    kv_lengths: str | None = None

    def kv_patterns(self) -> list[str]:
        """The length patterns of the grid's cache problems (``["full"]`` when not given).

        Raises:
            typer.BadParameter: a value that is not a pattern, naming ``--kv-lengths``.
        """
        if self.kv_lengths is None:
            return ["full"]
        return parse_kv_lengths(self.kv_lengths)

    def kv_pages(self) -> list[int | None]:
        """The grid's KV-cache layouts (``[None]``: dense problems only).

        Raises:
            typer.BadParameter: a value that is not a layout, naming ``--kv-page``.
        """
        if self.kv_page is None:
            return [None]
        return list(parse_kv_pages(self.kv_page))

    @property
    def any_variant(self) -> bool:
        """Whether an attention-variant option was given."""
        given = (self.window, self.window_left, self.window_right, self.chunk, self.softcap)
        return self.sinks or any(value is not None for value in given)

    def variant_args(self) -> tuple[int, int, int, float, bool]:
        """The variant options as (window left, window right, chunk, softcap, sinks), the
        defaults (plain) filled in; not yet normalised (that needs each problem's lengths).

        Raises:
            typer.BadParameter: ``--window`` with one of its halves, or not LEFT,RIGHT.
        """
        left, right = self.window_left, self.window_right
        if self.window is not None:
            if left is not None or right is not None:
                raise bad_option(
                    "--window", "give --window LEFT,RIGHT or --window-left/--window-right"
                )
            try:
                left, right = parse_window(self.window)
            except ShapeParamError as exc:
                raise bad_option("--window", str(exc)) from None
        return (
            -1 if left is None else left,
            -1 if right is None else right,
            0 if self.chunk is None else self.chunk,
            0.0 if self.softcap is None else self.softcap,
            self.sinks,
        )

    def variant_for(self, causal: bool, nq: int, nk: int) -> tuple[bool, Variant]:
        """The grid's variant for a problem of these lengths and mask, normalised.

        Raises:
            typer.BadParameter: a value out of its domain, naming the option.
        """
        left, right, chunk, softcap, sinks = self.variant_args()
        try:
            return resolve_variant(causal, window_left=left, window_right=right, chunk=chunk,
                                   softcap=softcap, sinks=sinks, nq=nq, nk=nk)  # fmt: skip
        except ShapeParamError as exc:
            option = (
                "--window"
                if self.window is not None and exc.param.startswith("window")
                else f"--{exc.param.replace('_', '-')}"
            )
            raise bad_option(option, str(exc)) from None

    @property
    def any_shape(self) -> bool:
        """Whether a shape option (one that makes a grid of problems) was given."""
        grid = (self.d, self.n, self.nq, self.nk, self.batch, self.heads, self.kv_heads)
        return any(value is not None for value in grid)

    @property
    def grid(self) -> bool:
        """Whether the options' grid is tuned: without a workload always (the defaults fill
        in), with one only when a shape option asks for it."""
        return not self.workloads or self.any_shape

    def check(self) -> None:
        """The combinations that are errors, whatever the values.

        Raises:
            typer.BadParameter: ``--n`` with ``--nq``, ``--nk`` without ``--nq``, or
                ``--dtype``/``--causal`` with a workload alone (the file sets both).
        """
        if self.n is not None and self.nq is not None:
            raise bad_option("--nq", "give --n (Nq = Nk) or --nq (with --nk), not both")
        if self.nk is not None and self.nq is None:
            raise bad_option("--nk", "needs --nq (--n is Nq = Nk)")
        if not self.grid:
            # Rather than silently ignore them: each workload entry has its own.
            given = [("--dtype", self.dtype), ("--causal", self.causal),
                     ("--kv-page", self.kv_page), ("--kv-lengths", self.kv_lengths)]  # fmt: skip
            if self.any_variant:
                given.append(("--window/--chunk/--softcap/--sinks", "given"))
            for option, value in given:
                if value is not None:
                    what = {"--window/--chunk/--softcap/--sinks": "the variant",
                            "--kv-page": "the KV-cache layout (kv_page:)",
                            "--kv-lengths": "the length pattern (kv_lengths:)"}.get(
                        option, option[2:])  # fmt: skip
                    raise bad_option(
                        option,
                        f"with --workload alone the file sets {what}; add a shape option "
                        "(--d, --n, --nq, --batch, --heads) to tune a grid as well",
                    )
        if self.any_variant:
            self.variant_args()  # --window's form, before any problem is planned
        self.kv_pages()  # --kv-page's values, likewise
        self.kv_patterns()


def _given(text: str | None, default: str) -> str:
    # Not `text or default`: an empty option is an error (parse_*_list says so), not a default.
    return default if text is None else text


def parse_shapes(options: ShapeOptions) -> list[Shape]:
    """Every (batch, heads, kv_heads, Nq, Nk) combination of the options, defaults filled in.

    Raises:
        typer.BadParameter: a value out of 1..2^31-1, or heads not a multiple of kv-heads.
    """
    options.check()
    batches = parse_int_list(_given(options.batch, DEFAULT_BATCH), "--batch")
    heads_list = parse_int_list(_given(options.heads, DEFAULT_HEADS), "--heads")
    kv_list = (
        parse_int_list(options.kv_heads, "--kv-heads") if options.kv_heads is not None else None
    )
    if options.nq is not None:
        nqs = parse_int_list(options.nq, "--nq")
        nks = parse_int_list(options.nk, "--nk") if options.nk is not None else None
        lengths = [(q, k) for q in nqs for k in (nks if nks is not None else [q])]
    else:
        lengths = [(n, n) for n in parse_int_list(_given(options.n, DEFAULT_N), "--n")]
    shapes: list[Shape] = []
    for batch in batches:
        for heads in heads_list:
            for kv_heads in kv_list if kv_list is not None else [heads]:
                if heads % kv_heads:
                    raise bad_option(
                        "--kv-heads", f"heads {heads} is not a multiple of kv-heads {kv_heads}"
                    )
                shapes.extend(Shape(q, k, batch, heads, kv_heads) for q, k in lengths)
    return shapes


def make_targets(
    ds: Sequence[int],
    dtypes: Sequence[Dtype],
    causals: Sequence[bool],
    shapes: Sequence[Shape],
    variant_for: Callable[[bool, Shape], tuple[bool, Variant]] | None = None,
    kv_pages: Sequence[int | None] = (None,),
    kv_lengths: Sequence[str] = ("full",),
) -> list[Target]:
    """The grid's problems, grouped by (dtype, causal, D) so builds are shared in turn;
    ``variant_for`` gives each its (normalised mask, variant) (None: plain); each shape once
    per KV-cache layout of ``kv_pages`` (None: dense), a cache layout once per length pattern
    of ``kv_lengths``."""
    out = []
    for dt in dtypes:
        for c in causals:
            for d in ds:
                for page, lengths in _cache_keys(kv_pages, kv_lengths):
                    for shape in shapes:
                        causal, variant = ((c, PLAIN) if variant_for is None
                                           else variant_for(c, shape))  # fmt: skip
                        out.append(Target(d=d, dtype=dt, causal=causal, shape=shape,
                                          variant=variant, kv_page=page,
                                          kv_lengths=lengths))  # fmt: skip
    return out


def _cache_keys(
    kv_pages: Sequence[int | None], kv_lengths: Sequence[str]
) -> list[tuple[int | None, str]]:
    """(layout, length pattern) of each problem per shape: a dense problem (None) has only
    ``full``, every sequence holding its keys."""
    return [(page, lengths) for page in kv_pages
            for lengths in (kv_lengths if page is not None else ("full",))]  # fmt: skip


def campaign_targets(options: ShapeOptions) -> list[Target]:
    """The campaign's problems: the options' grid, then each workload's in turn, each once.

    Raises:
        typer.BadParameter: for bad options or a bad workload file (exit status 2).
    """
    options.check()
    groups: list[list[Target]] = []
    if options.grid:
        ds = parse_head_dims(_given(options.d, DEFAULT_D))
        dtypes = parse_dtypes(_given(options.dtype, DEFAULT_DTYPE))
        causals = parse_bool_list(_given(options.causal, DEFAULT_CAUSAL), "--causal")
        variant_for = (
            (lambda c, sh: options.variant_for(c, sh.nq, sh.nk)) if options.any_variant else None
        )
        if options.kv_lengths is not None and options.kv_page is None:
            raise bad_option("--kv-lengths", "a KV-cache problem's length pattern: needs "
                             "--kv-page (0 for a contiguous cache)")  # fmt: skip
        groups.append(make_targets(ds, dtypes, causals, parse_shapes(options), variant_for,
                                   options.kv_pages(), options.kv_patterns()))  # fmt: skip
    groups.extend(workload_targets(path) for path in options.workloads)
    return unique_targets(groups)


def make_problems(gpu: str, targets: Sequence[Target]) -> list[Problem]:
    """The targets as problems on ``gpu``."""
    return [target.problem(gpu) for target in targets]


def workload_targets(path: Path) -> list[Target]:
    """The problems of a workload file.

    Raises:
        typer.BadParameter: a file that cannot be read or is not a workload.
    """
    try:
        workload = load_workload(path)
    except WorkloadError as exc:
        raise bad_option("--workload", str(exc)) from None
    log.info(
        "workload %s%s: %d problems",
        path, f" ({workload.name})" if workload.name else "", len(workload.targets),
    )  # fmt: skip
    for target in workload.targets:
        log.debug("  %s: %s", target.label, target.describe())
    return list(workload.targets)


def _select(
    text: str | None, option: str, parse: Callable[[str, str], list[T]]
) -> Callable[[T], bool]:
    if text is None:
        return lambda value: True
    allowed = set(parse(text, option))
    return lambda value: value in allowed


def replay_filter(shape: ShapeOptions) -> Callable[[Problem], bool]:
    """Which of a replay table's problems the options keep.

    In replay the table's problems are the campaign: each given option keeps the problems
    whose value is in its list (``--n``: square problems, Nq = Nk in the list), the options
    not given keep all. A workload file keeps its own problems too, and alone (no shape
    option) keeps only them. The heads/kv-heads multiple check does not apply: nothing is
    built from the lists.

    Raises:
        typer.BadParameter: for bad options or a bad workload file.
    """
    shape.check()
    keep_d = _select(shape.d, "--d", lambda t, o: parse_head_dims(t, o))
    keep_n = _select(shape.n, "--n", parse_int_list)
    keep_nq = _select(shape.nq, "--nq", parse_int_list)
    keep_nk = _select(shape.nk, "--nk", parse_int_list)
    keep_b = _select(shape.batch, "--batch", parse_int_list)
    keep_h = _select(shape.heads, "--heads", parse_int_list)
    keep_kv = _select(shape.kv_heads, "--kv-heads", parse_int_list)
    keep_dt = _select(shape.dtype, "--dtype", parse_dtypes)
    keep_c = _select(shape.causal, "--causal", parse_bool_list)
    # Without --kv-page every layout is kept, as any unnamed option keeps all.
    keep_page = _select(shape.kv_page, "--kv-page", lambda t, o: parse_kv_pages(t, o))
    # --kv-lengths alone keeps the cache problems of those patterns, of every layout.
    keep_lengths = _select(shape.kv_lengths, "--kv-lengths", parse_kv_lengths)
    targets = [t for path in shape.workloads for t in workload_targets(path)]
    grid = shape.grid

    def keep_variant(p: Problem) -> bool:
        # Without a variant option every variant is kept, as any unnamed option keeps all.
        if not shape.any_variant:
            return True
        return shape.variant_for(p.causal, p.n, p.n_keys) == (p.causal, p.variant)

    def keep(p: Problem) -> bool:
        in_grid = grid and (
            keep_d(p.d)
            and (shape.n is None or (keep_n(p.n) and p.n_keys == p.n))
            and keep_nq(p.n)
            and keep_nk(p.n_keys)
            and keep_b(p.batch)
            and keep_h(p.heads)
            and keep_kv(p.n_kv_heads)
            and keep_dt(p.dtype)
            and keep_c(p.causal)
            and keep_variant(p)
            and (shape.kv_page is None or (p.kv_page is not None and keep_page(p.kv_page)))
            and (shape.kv_lengths is None or (p.is_cache and keep_lengths(p.kv_lengths)))
        )
        return in_grid or any(t.matches(p) for t in targets)

    return keep


def replay_problems(table: ReplayTable, shape: ShapeOptions) -> list[Problem]:
    """The table's problems the options keep (:func:`replay_filter`), in campaign order.

    Raises:
        typer.BadParameter: for bad options, or when no problem of the table is kept.
    """
    from tuner.replay import in_campaign_order

    keep = replay_filter(shape)
    problems = in_campaign_order(p for p in table.problems.values() if keep(p))
    if not problems:
        studies = ", ".join(sorted(table.studies)) or "none"
        raise bad_option(
            "--replay", f"no problem of the table matches the options (table: {studies})"
        )
    return problems
