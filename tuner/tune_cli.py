"""``fa2tune tune``: search the best kernel config for every problem of a campaign.

Example (the default campaign: D 64 and 128, six lengths, fp16, full and causal, 24 problems,
30 GPU trials each, roughly a quarter of an hour on one H200 once the build cache is warm)::

    fa2tune tune
    fa2tune tune --d 128 --n 4096,8192 --causal yes --trials 60 --sampler tpe --seed 1
    fa2tune tune --time-budget 10m --dtype both       # fp16 and bf16: 48 problems
    fa2tune --db postgresql://... tune --device 1     # a second GPU sharing the studies
    fa2tune tune --replay table.json --sampler random  # no GPU: answers from a recorded table

Lists are comma-separated (``both`` in ``--dtype`` and ``--causal`` is every value); durations
are ``90``, ``90s``, ``10m``, ``1h30m``. Bad input exits with status 2. Re-running the same
command resumes its studies (in replay mode when the global ``--db`` names the database:
``fa2tune --db sqlite:///replay.db tune --replay table.json``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final, TypeVar

import optuna
import typer

from core.config import DTYPES, HEAD_DIMS, Dtype
from core.problem import Problem
from tuner import search
from tuner.campaign import DEFAULT_MAX_SPILL_BYTES, CampaignOptions, run_campaign
from tuner.progress import RichProgress, render_summary
from tuner.summary import CampaignSummary

if TYPE_CHECKING:
    from db.store import Store
    from measure.worker import BenchWorker

log = logging.getLogger(__name__)

DEFAULT_D: Final = "64,128"
DEFAULT_N: Final = "512,1024,2048,4096,8192,16384"
DEFAULT_DTYPE: Final = "fp16"
DEFAULT_CAUSAL: Final = "no,yes"
#: GPU trials per problem when neither --trials nor --time-budget is given (tpe, random):
#: 24 problems x 30 trials of ~1 s verify+time each fit the 15-minute campaign.
DEFAULT_TRIALS: Final = 30
EXIT_INTERRUPTED: Final = 130

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


def parse_int_list(
    text: str, option: str, allowed: Sequence[int] | None = None, minimum: int = 1
) -> list[int]:
    """Parse ``"64,128"``; every value must be an integer >= ``minimum`` (and in ``allowed``).

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
        if allowed is not None and value not in allowed:
            raise _bad(option, f"{value} is not one of {', '.join(map(str, allowed))}")
        values.append(value)
    return _unique(values)


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


def make_problems(
    gpu: str,
    ds: Sequence[int],
    ns: Sequence[int],
    dtypes: Sequence[str],
    causals: Sequence[bool],
    batch: int,
    heads: int,
) -> list[Problem]:
    """The campaign's problems, grouped by (dtype, causal, D) so builds are shared in turn."""
    return [
        Problem(gpu=gpu, d=d, n=n, batch=batch, heads=heads, dtype=dt, causal=c)  # type: ignore[arg-type]
        for dt in dtypes
        for c in causals
        for d in ds
        for n in ns
    ]


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
        str | None, typer.Option("--d", help="head dims, comma-separated", show_default=DEFAULT_D)
    ] = None,
    n: Annotated[
        str | None,
        typer.Option("--n", help="sequence lengths (Nq = Nk)", show_default=DEFAULT_N),
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
    batch: Annotated[int, typer.Option("--batch", min=1, help="batch size")] = 2,
    heads: Annotated[int, typer.Option("--heads", min=1, help="attention heads")] = 16,
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
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            help=(
                "answer from a recorded table (JSON) instead of the GPU. With the global --db "
                "the results and studies go to that database and rerunning the command "
                "resumes them; without it, to a scratch database deleted at exit (FA2TUNE_DB_URL "
                "is not used), so each run starts over"
            ),
        ),
    ] = None,
    summary_json: Annotated[
        Path | None, typer.Option("--summary-json", help="also write the summary as JSON here")
    ] = None,
) -> None:
    """Tune every (D, N, dtype, causal) problem: one optuna study each, resumable."""
    if sampler not in search.sampler_names():
        raise _bad("--sampler", f"{sampler!r} is not one of {', '.join(search.sampler_names())}")
    budget_s = parse_duration(time_budget) if time_budget is not None else None
    trials, budget_s = resolve_budget(sampler, trials, budget_s)
    options = CampaignOptions(
        sampler=sampler,
        trials=trials,
        time_budget_s=budget_s,
        max_spill_bytes=None if allow_spills else max_spill_bytes,
        seed=seed,
    )
    if replay is not None:
        summary = _tune_replay(replay, d, n, dtype, causal, options, _global_db(ctx))
    else:
        ds = parse_int_list(d or DEFAULT_D, "--d", allowed=HEAD_DIMS)
        ns = parse_int_list(n or DEFAULT_N, "--n")
        dtypes = parse_choice_list(dtype or DEFAULT_DTYPE, "--dtype", DTYPES, both=True)
        causals = parse_bool_list(causal or DEFAULT_CAUSAL, "--causal")
        if arch is not None:
            from codegen.space import SUPPORTED_ARCHS

            if arch not in SUPPORTED_ARCHS:
                raise _bad("--arch", f"{arch!r} is not one of {', '.join(SUPPORTED_ARCHS)}")
        summary = _tune_gpu(
            ds, ns, dtypes, causals, batch, heads, options, arch, device, job_timeout
        )
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
    ds: list[int],
    ns: list[int],
    dtypes: list[str],
    causals: list[bool],
    batch: int,
    heads: int,
    options: CampaignOptions,
    arch: str | None,
    device: int,
    job_timeout: float,
) -> CampaignSummary:
    # GPU, compiler and database modules load only here: the argument checks above (and the
    # replay mode) work on machines without torch or nvcc.
    from db.store import Store
    from fa2tune.settings import get_settings
    from measure.worker import BenchWorker, WorkerStartError

    settings = get_settings()
    _quiet_optuna()
    try:
        with (
            Store.from_url(settings.db_url) as store,
            BenchWorker(device=device, job_timeout_s=job_timeout) as worker,
        ):
            return _campaign_on_gpu(
                store, worker, settings.db_url, settings.build_jobs, ds, ns, dtypes, causals,
                batch, heads, options, arch, device,
            )  # fmt: skip
    except WorkerStartError as exc:
        # The campaign so far is saved; the same command resumes it once a worker starts.
        typer.echo(f"fa2tune tune: no GPU worker on device {device}: {exc}", err=True)
        raise typer.Exit(code=1) from None


def _campaign_on_gpu(
    store: Store,
    worker: BenchWorker,
    db_url: str,
    build_jobs: int,
    ds: list[int],
    ns: list[int],
    dtypes: list[str],
    causals: list[bool],
    batch: int,
    heads: int,
    options: CampaignOptions,
    arch: str | None,
    device: int,
) -> CampaignSummary:
    """Run the campaign with ``worker`` measuring; the problems are named after its GPU.

    Raises:
        typer.BadParameter: when the GPU's architecture is not supported.
        WorkerStartError: when the worker cannot start (no GPU, no torch).
    """
    from codegen.space import ARCH_SMEM_LIMIT
    from measure.gpuinfo import arch_for, current_gpu_info

    storage_url = search.resolve_storage_url(db_url)
    gpu = worker.gpu_info or current_gpu_info(device)
    target = arch or arch_for(gpu)
    if target not in ARCH_SMEM_LIMIT:
        raise _bad("--arch", f"the GPU's {target} is not supported; pass --arch")
    problems = make_problems(gpu.name, ds, ns, dtypes, causals, batch, heads)
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


def _tune_replay(
    path: Path,
    d: str | None,
    n: str | None,
    dtype: str | None,
    causal: str | None,
    options: CampaignOptions,
    db_url: str | None = None,
) -> CampaignSummary:
    from tuner.replay import in_campaign_order, load_replay_table, run_replay_campaign

    try:
        table = load_replay_table(path)
    except (OSError, ValueError) as exc:
        raise _bad("--replay", str(exc)) from None
    # In replay the table's problems are the campaign; --d/--n/--dtype/--causal only filter
    # them (--batch and --heads are the table's).
    known = list(table.problems.values())
    keep_d = _select(d, "--d", lambda t, o: parse_int_list(t, o, HEAD_DIMS))
    keep_n = _select(n, "--n", parse_int_list)
    keep_dt = _select(dtype, "--dtype", lambda t, o: parse_choice_list(t, o, DTYPES, both=True))
    keep_c = _select(causal, "--causal", parse_bool_list)
    problems = in_campaign_order(
        p for p in known if keep_d(p.d) and keep_n(p.n) and keep_dt(p.dtype) and keep_c(p.causal)
    )
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
