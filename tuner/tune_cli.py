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
    fa2tune tune --d 128 --n 8192,16384 --causal yes --window 4096,0  # a sliding window
    fa2tune tune --family splitkv --kv-page 16 --nq 1 --nk 8192 --batch 8 --heads 32 \
        --kv-heads 8 --d 128 --dtype bf16 --causal no  # the cache kernels, 16-token pages
    fa2tune tune --family splitkv --kv-page 16 --kv-lengths mixed --nq 1 --nk 32768 \
        --batch 32 --heads 32 --kv-heads 8 --d 128 --dtype bf16  # a serving batch's lengths

Lists are comma-separated (``both`` in ``--dtype`` and ``--causal`` is every value); every
combination of the lists is a problem. ``--n`` is Nq = Nk; ``--nq`` with ``--nk`` crosses
the two. ``--workload`` adds the problems of a workload file (:mod:`tuner.workload`) to those
of the options, or tunes only them when no shape option is given. Durations are ``90``,
``90s``, ``10m``, ``1h30m``. Bad input exits with status 2. Re-running the same command
resumes its studies (in replay mode when the global ``--db`` names the database:
``fa2tune --db sqlite:///replay.db tune --replay table.json``).

This module parses and validates the command line only: the value syntax is
:mod:`tuner.cli_values`'s, the problems are planned from the options by
:mod:`tuner.campaign_plan`, and :mod:`tuner.campaign_run` runs the campaign (storage, store,
worker, summary). A worker that cannot start exits with status 1, an interrupted campaign
with 130.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final

import typer

from core.config import HEAD_DIMS_RULE
from tuner import campaign_run, search
from tuner.campaign import DEFAULT_MAX_SPILL_BYTES, CampaignOptions
from tuner.campaign_plan import (
    DEFAULT_BATCH,
    DEFAULT_CAUSAL,
    DEFAULT_D,
    DEFAULT_DTYPE,
    DEFAULT_HEADS,
    DEFAULT_N,
    ShapeOptions,
    campaign_targets,
    replay_problems,
)
from tuner.campaign_run import DEFAULT_TARGET_MS
from tuner.cli_values import bad_option, check_family_head_dims, parse_duration, parse_families
from tuner.warm_start import DEFAULT_TOP as DEFAULT_WARM_TOP
from tuner.warm_start import TransferError, load_warm_start

#: GPU trials per problem when neither --trials nor --time-budget is given (tpe, random):
#: 24 problems x 30 trials of ~1 s verify+time each fit the 15-minute campaign.
DEFAULT_TRIALS: Final = 30
#: The exit status of a campaign stopped by Ctrl-C (its studies stay resumable).
EXIT_INTERRUPTED: Final = 130
#: The exit status when no GPU worker starts.
EXIT_NO_WORKER: Final = 1


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
        list[Path] | None,
        typer.Option(
            "--workload",
            help=(
                "a workload file (.yaml, .yml, .json) listing a model's calls; its problems "
                "are added to the options', or tuned alone when no shape option is given; "
                "repeat the option for several files"
            ),
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option(
            "--window",
            help="the grid's local attention window LEFT,RIGHT (FlashAttention's window_size, "
            "-1: no bound), e.g. 4096,0; or --window-left/--window-right",
        ),
    ] = None,
    window_left: Annotated[
        int | None, typer.Option("--window-left", help="the window's left bound")
    ] = None,
    window_right: Annotated[
        int | None, typer.Option("--window-right", help="the window's right bound")
    ] = None,
    chunk: Annotated[
        int | None, typer.Option("--chunk", help="the grid's chunked attention (0: none)")
    ] = None,
    softcap: Annotated[
        float | None, typer.Option("--softcap", help="the grid's logit softcap (0: none)")
    ] = None,
    sinks: Annotated[bool, typer.Option("--sinks", help="the grid's attention sinks")] = False,
    kv_page: Annotated[
        str | None,
        typer.Option(
            "--kv-page",
            help="KV-cache layouts, comma-separated: 0 (a contiguous cache) or a power of two "
            "up to 4096 (a paged cache's page size); each problem of the grid is then timed on "
            "the split-KV cache kernels over such a cache, nk keys per sequence",
            show_default="dense problems",
        ),
    ] = None,
    kv_lengths: Annotated[
        str | None,
        typer.Option(
            "--kv-lengths",
            help="with --kv-page: the cache problems' length patterns, comma-separated: full "
            "(every sequence holds nk keys), mixed (a fixed seeded spread up to nk, as a "
            "serving batch) or both; each pattern is a problem of its own",
            show_default="full",
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
                "changed; a KV-cache problem also starts from the dense shape's winners, as "
                "their cache twins"
            ),
        ),
    ] = None,
    warm_start_top: Annotated[
        int,
        typer.Option("--warm-start-top", min=1, help="configs per problem taken from --warm-start"),
    ] = DEFAULT_WARM_TOP,
    warm_start_other_dtype: Annotated[
        bool,
        typer.Option(
            "--warm-start-other-dtype",
            help=(
                "also start each problem from the other 16-bit dtype's winners of the same "
                "shape in --warm-start (fp16 from bf16 and back), after its own"
            ),
        ),
    ] = False,
) -> None:
    """Tune every (D, shape, dtype, causal) problem: one optuna study each, resumable."""
    if sampler not in search.sampler_names():
        raise bad_option(
            "--sampler", f"{sampler!r} is not one of {', '.join(search.sampler_names())}"
        )
    budget_s = parse_duration(time_budget) if time_budget is not None else None
    trials, budget_s = resolve_budget(sampler, trials, budget_s)
    families = parse_families(family)
    if warm_start_other_dtype and warm_start is None:
        raise bad_option("--warm-start-other-dtype", "needs --warm-start (the results file)")
    try:
        warm = (load_warm_start(warm_start, warm_start_top, warm_start_other_dtype)
                if warm_start is not None else None)  # fmt: skip
    except TransferError as exc:
        raise bad_option("--warm-start", str(exc)) from None
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
        kv_heads=kv_heads, workloads=tuple(workload or ()), window=window, window_left=window_left,
        window_right=window_right, chunk=chunk, softcap=softcap, sinks=sinks, kv_page=kv_page,
        kv_lengths=kv_lengths,
    )  # fmt: skip
    if replay is not None:
        from tuner.replay_table import load_replay_table

        try:
            table = load_replay_table(replay)
        except (OSError, ValueError) as exc:
            raise bad_option("--replay", str(exc)) from None
        # In replay the table's problems are the campaign; the options only filter them.
        problems = replay_problems(table, shape_options)
        summary = campaign_run.tune_replay(table, problems, options, _global_db(ctx), replay)
    else:
        targets = campaign_targets(shape_options)
        check_family_head_dims((t.d for t in targets), families)
        if arch is not None:
            from codegen.targets import SUPPORTED_ARCHS

            if arch not in SUPPORTED_ARCHS:
                raise bad_option("--arch", f"{arch!r} is not one of {', '.join(SUPPORTED_ARCHS)}")
        try:
            summary = campaign_run.tune_gpu(targets, options, arch, device, job_timeout, target_ms)
        except campaign_run.UnsupportedArchError as exc:
            raise bad_option("--arch", str(exc)) from None
        except campaign_run.NoWorkerError as exc:
            # The campaign so far is saved; the same command resumes it once a worker starts.
            typer.echo(f"fa2tune tune: {exc}", err=True)
            raise typer.Exit(code=EXIT_NO_WORKER) from None
    campaign_run.report(summary, summary_json)
    if summary.interrupted:
        raise typer.Exit(code=EXIT_INTERRUPTED)


def _global_db(ctx: typer.Context | None) -> str | None:
    """The ``--db`` given on the command line (``fa2tune --db URL tune``), if any."""
    if ctx is None:
        return None
    db = ctx.find_root().params.get("db")
    return db if isinstance(db, str) else None
