"""``fa2tune tune``: search the best kernel config for every problem of a campaign.

Example (the default campaign: D 64 and 128, six lengths, fp16, full and causal, 24 problems,
30 GPU trials each, roughly a quarter of an hour on one H200 once the build cache is warm)::

    fa2tune tune
    fa2tune tune --d 128 --n 4096,8192 --causal yes --trials 60 --sampler tpe --seed 1
    fa2tune tune --time-budget 10m --dtype both       # fp16 and bf16: 48 problems
    fa2tune --db postgresql://... tune --device 1     # a second GPU sharing the studies
    fa2tune tune --replay table.json --sampler random  # no GPU: answers from a recorded table
    fa2tune tune --d 128 --nq 1 --nk 8192,32768 --batch 1,8 --heads 32 --kv-heads 8  # decode
    fa2tune tune --workload examples/workloads/llama3_8b.yaml  # the calls a model makes

Lists are comma-separated (``both`` in ``--dtype`` and ``--causal`` is every value); every
combination of the lists is a problem. ``--n`` is Nq = Nk; ``--nq`` with ``--nk`` crosses
the two. ``--workload`` adds the problems of a workload file (:mod:`tuner.workload`) to those
of the options, or tunes only them when no shape option is given. Durations are ``90``,
``90s``, ``10m``, ``1h30m``. Bad input exits with status 2. Re-running the same command
resumes its studies (in replay mode when the global ``--db`` names the database:
``fa2tune --db sqlite:///replay.db tune --replay table.json``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final, TypeVar

import optuna
import typer

from core.config import DTYPES, HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.problem import Problem
from core.shape import MAX_DIM, Shape
from tuner import search
from tuner.campaign import DEFAULT_MAX_SPILL_BYTES, CampaignOptions, run_campaign
from tuner.progress import RichProgress, render_summary
from tuner.summary import CampaignSummary
from tuner.warm_start import DEFAULT_TOP as DEFAULT_WARM_TOP
from tuner.warm_start import TransferError, load_warm_start
from tuner.workload import Target, WorkloadError, load_workload, unique_targets

if TYPE_CHECKING:
    from db.store import Store
    from measure.worker import BenchWorker

log = logging.getLogger(__name__)

DEFAULT_D: Final = "64,128"
DEFAULT_N: Final = "512,1024,2048,4096,8192,16384"
DEFAULT_DTYPE: Final = "fp16"
DEFAULT_CAUSAL: Final = "no,yes"
DEFAULT_BATCH: Final = "2"
DEFAULT_HEADS: Final = "16"
#: GPU trials per problem when neither --trials nor --time-budget is given (tpe, random):
#: 24 problems x 30 trials of ~1 s verify+time each fit the 15-minute campaign.
DEFAULT_TRIALS: Final = 30
EXIT_INTERRUPTED: Final = 130
#: Timing target per config (ms); the measurement stage's own default.
DEFAULT_TARGET_MS: Final = 200.0

_TRUE = {"yes", "y", "true", "1", "causal", "on"}
_FALSE = {"no", "n", "false", "0", "full", "off"}
#: In --dtype and --causal: every value (as the help says: "fp16, bf16 or both").
_BOTH: Final = "both"
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s)?")
T = TypeVar("T")


def _bad(option: str, message: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=f"'{option}'")


def _split(text: str, option: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise _bad(option, f"expected a comma-separated list, got {text!r}")
    return items


def _unique(items: Sequence[T]) -> list[T]:
    return list(dict.fromkeys(items))


def worker_error(exc: BaseException) -> str:
    """One line for a worker that could not start: the child's traceback reduced to its last
    line (the exception), with what to install when torch or cuda-bindings is missing."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    head, last = lines[0], lines[-1]
    text = head if len(lines) == 1 else f"{head.rstrip(':')}: {last}"
    if "No module named 'torch'" in text or "No module named 'cuda'" in text:
        text += " (install the GPU extra: pip install 'fa2tune[gpu]')"
    return text


def parse_families(text: str | None) -> tuple[str, ...] | None:
    """``--family``: known kernel family names, in the registry's order; None when not given.

    Raises:
        typer.BadParameter: an unknown family.
    """
    if text is None:
        return None
    from codegen.families import FAMILIES

    names = _split(text, "--family")
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise _bad("--family", f"unknown {', '.join(unknown)} (known: {', '.join(FAMILIES)})")
    return tuple(f for f in FAMILIES if f in names)


def check_family_head_dims(ds: Iterable[int], families: Sequence[str] | None) -> None:
    """Refuse head dims none of the families named by ``--family`` has (with every family,
    fa2's head dims are all the supported ones; a family lacking a head dim is skipped there).

    Raises:
        typer.BadParameter: a head dim no named family has, naming the families' head dims.
    """
    if families is None:
        return
    from codegen.families import FAMILIES

    named = [FAMILIES[name] for name in families]
    for d in sorted(set(ds)):
        if not any(d in f.head_dims for f in named):
            names = ", ".join(f.name for f in named)
            who = names if len(named) == 1 else f"none of {names}"
            dims = "; ".join(f"{f.name}: {f.head_dims_text}" for f in named)
            raise _bad("--family", f"{who} has no head dim {d} (head dims {dims})")


def parse_int_list(
    text: str,
    option: str,
    allowed: Sequence[int] | None = None,
    minimum: int = 1,
    maximum: int = MAX_DIM,
    allowed_text: str | None = None,
) -> list[int]:
    """Parse ``"64,128"``; every value must be an integer in ``minimum..maximum`` (by default
    the kernels' int32 range) and in ``allowed`` (``allowed_text``, when given, says what
    ``allowed`` is in the message instead of listing it).

    Raises:
        typer.BadParameter: on anything else (typer exits with status 2).
    """
    values = []
    for item in _split(text, option):
        try:
            value = int(item)
        except ValueError:
            raise _bad(option, f"{item!r} is not an integer") from None
        if value < minimum:
            raise _bad(option, f"{value} is below {minimum}")
        if value > maximum:
            raise _bad(option, f"{value} is above {maximum}")
        if allowed is not None and value not in allowed:
            what = allowed_text or f"one of {', '.join(map(str, allowed))}"
            raise _bad(option, f"{value} is not {what}")
        values.append(value)
    return _unique(values)


def parse_head_dims(text: str, option: str = "--d") -> list[int]:
    """Parse ``"40,128"``: supported head dims (:data:`core.config.HEAD_DIMS`)."""
    return parse_int_list(text, option, HEAD_DIMS, allowed_text=HEAD_DIMS_RULE)


def parse_choice_list(
    text: str, option: str, allowed: Sequence[str], *, both: bool = False
) -> list[str]:
    """Parse ``"fp16,bf16"`` against the allowed values (case-insensitive).

    Args:
        text: the option's value.
        option: the option's name, for messages.
        allowed: the values it may hold.
        both: also accept ``both``, standing for every allowed value in their order.

    Raises:
        typer.BadParameter: for a value not allowed.
    """
    values: list[str] = []
    for item in _split(text, option):
        word = item.lower()
        if both and word == _BOTH:
            values.extend(allowed)
        elif word in allowed:
            values.append(word)
        else:
            choices = f"{', '.join(allowed)} or {_BOTH}" if both else ", ".join(allowed)
            raise _bad(option, f"{item!r} is not one of {choices}")
    return _unique(values)


def parse_bool_list(text: str, option: str) -> list[bool]:
    """Parse ``"no,yes"`` (also true/false, 1/0, full/causal; ``both`` is no and yes) into
    booleans.

    Raises:
        typer.BadParameter: for anything else.
    """
    values: list[bool] = []
    for item in _split(text, option):
        word = item.lower()
        if word == _BOTH:
            values.extend((False, True))
        elif word in _TRUE:
            values.append(True)
        elif word in _FALSE:
            values.append(False)
        else:
            raise _bad(option, f"{item!r} is not yes or no (or {_BOTH})")
    return _unique(values)


def parse_duration(text: str, option: str = "--time-budget") -> float:
    """Parse ``"600"``, ``"90s"``, ``"10m"``, ``"1h30m"`` or ``"1.5h"`` into seconds (> 0).

    Raises:
        typer.BadParameter: for anything else.
    """
    compact = text.strip().lower().replace(" ", "")
    pos, total, units = 0, 0.0, []
    while pos < len(compact):
        m = _DURATION_RE.match(compact, pos)
        if m is None:
            break
        unit = m[2] or ""
        total += float(m[1]) * {"h": 3600, "m": 60, "s": 1, "": 1}[unit]
        units.append(unit)
        pos = m.end()
    # A bare number means seconds, but only on its own ("1h 2" is ambiguous).
    ambiguous = "" in units and len(units) > 1
    if not compact or pos != len(compact) or len(set(units)) != len(units) or ambiguous:
        raise _bad(option, f"{text!r} is not a duration (e.g. 600, 90s, 10m, 1h30m)")
    if total <= 0:
        raise _bad(option, "the duration must be positive")
    return total


@dataclass(frozen=True)
class ShapeOptions:
    """The problem options as given on the command line (None: not given).

    Attributes:
        d, n, nq, nk, dtype, causal, batch, heads, kv_heads: the comma-separated lists.
        workload: the ``--workload`` file.
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
    workload: Path | None = None

    @property
    def any_shape(self) -> bool:
        """Whether a shape option (one that makes a grid of problems) was given."""
        grid = (self.d, self.n, self.nq, self.nk, self.batch, self.heads, self.kv_heads)
        return any(value is not None for value in grid)

    @property
    def grid(self) -> bool:
        """Whether the options' grid is tuned: without a workload always (the defaults fill
        in), with one only when a shape option asks for it."""
        return self.workload is None or self.any_shape

    def check(self) -> None:
        """The combinations that are errors, whatever the values.

        Raises:
            typer.BadParameter: ``--n`` with ``--nq``, ``--nk`` without ``--nq``, or
                ``--dtype``/``--causal`` with a workload alone (the file sets both).
        """
        if self.n is not None and self.nq is not None:
            raise _bad("--nq", "give --n (Nq = Nk) or --nq (with --nk), not both")
        if self.nk is not None and self.nq is None:
            raise _bad("--nk", "needs --nq (--n is Nq = Nk)")
        if not self.grid:
            # Rather than silently ignore them: each workload entry has its own.
            for option, value in (("--dtype", self.dtype), ("--causal", self.causal)):
                if value is not None:
                    raise _bad(
                        option,
                        f"with --workload alone the file sets {option[2:]}; add a shape option "
                        "(--d, --n, --nq, --batch, --heads) to tune a grid as well",
                    )


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
                    raise _bad(
                        "--kv-heads", f"heads {heads} is not a multiple of kv-heads {kv_heads}"
                    )
                shapes.extend(Shape(q, k, batch, heads, kv_heads) for q, k in lengths)
    return shapes


def make_targets(
    ds: Sequence[int], dtypes: Sequence[Dtype], causals: Sequence[bool], shapes: Sequence[Shape]
) -> list[Target]:
    """The grid's problems, grouped by (dtype, causal, D) so builds are shared in turn."""
    return [
        Target(d=d, dtype=dt, causal=c, shape=shape)
        for dt in dtypes
        for c in causals
        for d in ds
        for shape in shapes
    ]


def campaign_targets(options: ShapeOptions) -> list[Target]:
    """The campaign's problems: the options' grid, then the workload's, each once.

    Raises:
        typer.BadParameter: for bad options or a bad workload file (exit status 2).
    """
    options.check()
    groups: list[list[Target]] = []
    if options.grid:
        ds = parse_head_dims(_given(options.d, DEFAULT_D))
        dtypes = _parse_dtypes(_given(options.dtype, DEFAULT_DTYPE))
        causals = parse_bool_list(_given(options.causal, DEFAULT_CAUSAL), "--causal")
        groups.append(make_targets(ds, dtypes, causals, parse_shapes(options)))
    groups.append(_workload_targets(options.workload))
    return unique_targets(groups)


def make_problems(gpu: str, targets: Sequence[Target]) -> list[Problem]:
    """The targets as problems on ``gpu``."""
    return [target.problem(gpu) for target in targets]


def _parse_dtypes(text: str) -> list[Dtype]:
    chosen = parse_choice_list(text, "--dtype", DTYPES, both=True)
    # The same values, typed as Dtype (parse_choice_list returns only allowed ones).
    return [next(dt for dt in DTYPES if dt == word) for word in chosen]


def _workload_targets(path: Path | None) -> list[Target]:
    if path is None:
        return []
    try:
        workload = load_workload(path)
    except WorkloadError as exc:
        raise _bad("--workload", str(exc)) from None
    log.info(
        "workload %s%s: %d problems",
        path, f" ({workload.name})" if workload.name else "", len(workload.targets),
    )  # fmt: skip
    for target in workload.targets:
        log.debug("  %s: %s", target.label, target.describe())
    return list(workload.targets)


def resolve_budget(
    sampler: str, trials: int | None, time_budget_s: float | None
) -> tuple[int | None, float | None]:
    """The default budget: 30 GPU trials per problem, or every config for ``grid``."""
    if trials is None and time_budget_s is None and sampler != "grid":
        return DEFAULT_TRIALS, None
    return trials, time_budget_s


def tune(
    ctx: typer.Context,
    d: Annotated[
        str | None,
        typer.Option(
            "--d",
            help=f"head dims, comma-separated, each {HEAD_DIMS_RULE}",
            show_default=DEFAULT_D,
        ),
    ] = None,
    n: Annotated[
        str | None,
        typer.Option("--n", help="sequence lengths (Nq = Nk)", show_default=DEFAULT_N),
    ] = None,
    nq: Annotated[
        str | None,
        typer.Option("--nq", help="query lengths, crossed with --nk (instead of --n)"),
    ] = None,
    nk: Annotated[
        str | None,
        typer.Option("--nk", help="key lengths (with --nq)", show_default="Nq"),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="fp16, bf16 or both", show_default=DEFAULT_DTYPE)
    ] = None,
    causal: Annotated[
        str | None, typer.Option("--causal", help="no, yes or both", show_default=DEFAULT_CAUSAL)
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(
            "--trials",
            min=1,
            help="configs to run on the GPU per problem (build rejections are free)",
            show_default=f"{DEFAULT_TRIALS}; grid: all",
        ),
    ] = None,
    time_budget: Annotated[
        str | None,
        typer.Option("--time-budget", help="wall-clock budget of the campaign, e.g. 10m, 1h30m"),
    ] = None,
    batch: Annotated[
        str | None, typer.Option("--batch", help="batch sizes", show_default=DEFAULT_BATCH)
    ] = None,
    heads: Annotated[
        str | None, typer.Option("--heads", help="query heads", show_default=DEFAULT_HEADS)
    ] = None,
    kv_heads: Annotated[
        str | None,
        typer.Option(
            "--kv-heads",
            help="key/value heads (GQA when fewer); each --heads a multiple of each",
            show_default="--heads",
        ),
    ] = None,
    workload: Annotated[
        Path | None,
        typer.Option(
            "--workload",
            help=(
                "a workload file (.yaml, .yml, .json) listing a model's calls; its problems "
                "are added to the options', or tuned alone when no shape option is given"
            ),
        ),
    ] = None,
    sampler: Annotated[
        str, typer.Option("--sampler", help="tpe, random or grid (exhaustive)")
    ] = "tpe",
    max_spill_bytes: Annotated[
        int,
        typer.Option(
            "--max-spill-bytes",
            min=0,
            help="time builds spilling at most this many bytes per thread (0: none that spill)",
        ),
    ] = DEFAULT_MAX_SPILL_BYTES,
    allow_spills: Annotated[
        bool, typer.Option("--allow-spills", help="time every build, however much it spills")
    ] = False,
    arch: Annotated[
        str | None, typer.Option("--arch", help="nvcc architecture", show_default="the GPU's")
    ] = None,
    device: Annotated[int, typer.Option("--device", min=0, help="CUDA device index")] = 0,
    seed: Annotated[
        int, typer.Option("--seed", help="sampler seed (mixed with problem and device)")
    ] = search.DEFAULT_SEED,
    job_timeout: Annotated[
        float, typer.Option("--job-timeout", min=1.0, help="seconds before a hung job is killed")
    ] = 60.0,
    family: Annotated[
        str | None,
        typer.Option(
            "--family",
            help="kernel families to search, comma-separated (fa2, fa3, splitkv)",
            show_default="every family that runs on the GPU and serves the problem",
        ),
    ] = None,
    target_ms: Annotated[
        float,
        typer.Option(
            "--target-ms",
            min=1.0,
            max=10_000.0,
            help="timing: repeat each config's launches for about this long (median of reps)",
        ),
    ] = DEFAULT_TARGET_MS,
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            help=(
                "answer from a recorded table (JSON) instead of the GPU; the options select "
                "its problems. With the global --db "
                "the results and studies go to that database and rerunning the command "
                "resumes them; without it, to a scratch database deleted at exit (FA2TUNE_DB_URL "
                "is not used), so each run starts over"
            ),
        ),
    ] = None,
    summary_json: Annotated[
        Path | None, typer.Option("--summary-json", help="also write the summary as JSON here")
    ] = None,
    warm_start: Annotated[
        Path | None,
        typer.Option(
            "--warm-start",
            help=(
                "a results file (fa2tune dump) whose fastest configs per problem each new "
                "study measures first, e.g. to re-time earlier winners after the templates "
                "changed"
            ),
        ),
    ] = None,
    warm_start_top: Annotated[
        int,
        typer.Option("--warm-start-top", min=1, help="configs per problem taken from --warm-start"),
    ] = DEFAULT_WARM_TOP,
) -> None:
    """Tune every (D, shape, dtype, causal) problem: one optuna study each, resumable."""
    if sampler not in search.sampler_names():
        raise _bad("--sampler", f"{sampler!r} is not one of {', '.join(search.sampler_names())}")
    budget_s = parse_duration(time_budget) if time_budget is not None else None
    trials, budget_s = resolve_budget(sampler, trials, budget_s)
    families = parse_families(family)
    try:
        warm = load_warm_start(warm_start, warm_start_top) if warm_start is not None else None
    except TransferError as exc:
        raise _bad("--warm-start", str(exc)) from None
    options = CampaignOptions(
        sampler=sampler,
        trials=trials,
        time_budget_s=budget_s,
        max_spill_bytes=None if allow_spills else max_spill_bytes,
        seed=seed,
        families=families,
        warm_start=warm,
    )
    shape_options = ShapeOptions(
        d=d, n=n, nq=nq, nk=nk, dtype=dtype, causal=causal, batch=batch, heads=heads,
        kv_heads=kv_heads, workload=workload,
    )  # fmt: skip
    if replay is not None:
        summary = _tune_replay(replay, shape_options, options, _global_db(ctx))
    else:
        targets = campaign_targets(shape_options)
        check_family_head_dims((t.d for t in targets), families)
        if arch is not None:
            from codegen.targets import SUPPORTED_ARCHS

            if arch not in SUPPORTED_ARCHS:
                raise _bad("--arch", f"{arch!r} is not one of {', '.join(SUPPORTED_ARCHS)}")
        summary = _tune_gpu(targets, options, arch, device, job_timeout, target_ms)
    render_summary(summary)
    if summary_json is not None:
        summary_json.write_text(json.dumps(summary.to_dict(), indent=1) + "\n", encoding="utf-8")
    if summary.interrupted:
        raise typer.Exit(code=EXIT_INTERRUPTED)


def _quiet_optuna() -> None:
    # optuna logs every trial at INFO; the live display already shows them.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def _tune_gpu(
    targets: list[Target],
    options: CampaignOptions,
    arch: str | None,
    device: int,
    job_timeout: float,
    target_ms: float = DEFAULT_TARGET_MS,
) -> CampaignSummary:
    # GPU, compiler and database modules load only here: the argument checks above (and the
    # replay mode) work on machines without torch or nvcc.
    from core.settings import get_settings
    from db.store import Store
    from measure.jobs import MeasureOptions
    from measure.timing import TimingOptions
    from measure.worker import BenchWorker, WorkerStartError

    settings = get_settings()
    timing = MeasureOptions(timing=TimingOptions(target_ms=target_ms))
    _quiet_optuna()
    try:
        with (
            Store.from_url(settings.db_url) as store,
            BenchWorker(device=device, job_timeout_s=job_timeout, options=timing) as worker,
        ):
            return _campaign_on_gpu(
                store, worker, settings.db_url, settings.build_jobs, targets, options, arch,
                device,
            )  # fmt: skip
    except WorkerStartError as exc:
        # The campaign so far is saved; the same command resumes it once a worker starts.
        log.debug("worker start failed", exc_info=True)
        typer.echo(f"fa2tune tune: no GPU worker on device {device}: {worker_error(exc)}", err=True)
        raise typer.Exit(code=1) from None


def _campaign_on_gpu(
    store: Store,
    worker: BenchWorker,
    db_url: str,
    build_jobs: int,
    targets: list[Target],
    options: CampaignOptions,
    arch: str | None,
    device: int,
) -> CampaignSummary:
    """Run the campaign with ``worker`` measuring; the problems are named after its GPU.

    Raises:
        typer.BadParameter: when the GPU's architecture is not supported.
        WorkerStartError: when the worker cannot start (no GPU, no torch).
    """
    from codegen.targets import ARCH_SMEM_LIMIT
    from measure.gpuinfo import arch_for, current_gpu_info

    storage_url = search.resolve_storage_url(db_url)
    gpu = worker.gpu_info or current_gpu_info(device)
    target = arch or arch_for(gpu)
    if target not in ARCH_SMEM_LIMIT:
        raise _bad("--arch", f"the GPU's {target} is not supported; pass --arch")
    problems = make_problems(gpu.name, targets)
    log.info(
        "tuning %d problems on %s (%s, device %d), sampler %s",
        len(problems), gpu.name, target, device, options.sampler,
    )  # fmt: skip
    # The space, seeds and nvcc builds are run_campaign's defaults for this architecture.
    on_device = replace(options, arch=target, worker_index=device, build_batch=build_jobs)
    with RichProgress() as progress:
        return run_campaign(
            problems,
            on_device,
            store=store,
            storage_url=storage_url,
            gpu=gpu,
            measure_fn=worker.measure,
            progress=progress,
        )


def _select(
    text: str | None, option: str, parse: Callable[[str, str], list[T]]
) -> Callable[[T], bool]:
    if text is None:
        return lambda value: True
    allowed = set(parse(text, option))
    return lambda value: value in allowed


def _global_db(ctx: typer.Context | None) -> str | None:
    """The ``--db`` given on the command line (``fa2tune --db URL tune``), if any."""
    if ctx is None:
        return None
    db = ctx.find_root().params.get("db")
    return db if isinstance(db, str) else None


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
    keep_dt = _select(
        shape.dtype, "--dtype", lambda t, o: parse_choice_list(t, o, DTYPES, both=True)
    )
    keep_c = _select(shape.causal, "--causal", parse_bool_list)
    targets = _workload_targets(shape.workload)
    grid = shape.grid

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
        )
        return in_grid or any(t.matches(p) for t in targets)

    return keep


def _tune_replay(
    path: Path,
    shape: ShapeOptions,
    options: CampaignOptions,
    db_url: str | None = None,
) -> CampaignSummary:
    from tuner.replay import in_campaign_order, load_replay_table, run_replay_campaign

    try:
        table = load_replay_table(path)
    except (OSError, ValueError) as exc:
        raise _bad("--replay", str(exc)) from None
    # In replay the table's problems are the campaign; the options only filter them.
    keep = replay_filter(shape)
    problems = in_campaign_order(p for p in table.problems.values() if keep(p))
    if not problems:
        studies = ", ".join(sorted(table.studies)) or "none"
        raise _bad("--replay", f"no problem of the table matches the options (table: {studies})")
    dtypes: set[Dtype] = {p.dtype for p in problems}
    log.info("replaying %d problems (%s) from %s", len(problems), ", ".join(dtypes), path)
    _quiet_optuna()
    if db_url is not None:
        log.info("replay results and studies go to %s", db_url)
    with RichProgress() as progress:
        # Without --db a scratch store: replayed results are not measurements and go to a
        # real database only when one is named on the command line (not from the
        # environment's FA2TUNE_DB_URL).
        return run_replay_campaign(
            table, options, store=db_url, problems=problems, progress=progress
        )
