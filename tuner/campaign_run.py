"""One ``fa2tune tune`` campaign run: storage, store and worker opened, campaign, summary.

The command line (:mod:`tuner.tune_cli`) parses and validates; this module runs what it
asked for. :func:`tune_gpu` opens the results store and the optuna storage of the settings'
database, starts a GPU worker, names the problems after its GPU and runs
:func:`tuner.campaign.run_campaign` with a live display; :func:`tune_replay` runs a
campaign answered from a replay table (:func:`tuner.replay.run_replay_campaign`);
:func:`report` shows the summary and writes it as JSON. A worker that cannot start raises
:class:`NoWorkerError`, a GPU of no supported architecture :class:`UnsupportedArchError`;
the campaign so far stays saved, and the same command resumes it.

GPU, compiler and database modules load only inside :func:`tune_gpu`: the argument checks
and the replay mode work on machines without torch or nvcc.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

import optuna

from tuner import search
from tuner.campaign import CampaignOptions, run_campaign
from tuner.campaign_plan import make_problems
from tuner.progress import RichProgress, render_summary
from tuner.summary import CampaignSummary
from tuner.workload import Target

if TYPE_CHECKING:
    from core.problem import Problem
    from db.store import Store
    from measure.worker import BenchWorker
    from tuner.replay_table import ReplayTable

log = logging.getLogger(__name__)

#: Timing target per config (ms); the measurement stage's own default.
DEFAULT_TARGET_MS: Final = 200.0


class NoWorkerError(RuntimeError):
    """No GPU worker could start on the device; the message says why in one line."""


class UnsupportedArchError(ValueError):
    """The GPU's architecture is not one the kernels are built for (pass ``--arch``)."""


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


def quiet_optuna() -> None:
    """Silence optuna's per-trial INFO lines (the live display shows the trials) unless the
    log level is DEBUG."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def tune_gpu(
    targets: list[Target],
    options: CampaignOptions,
    arch: str | None,
    device: int,
    job_timeout: float,
    target_ms: float = DEFAULT_TARGET_MS,
) -> CampaignSummary:
    """Run the campaign of ``targets`` on GPU ``device``, recording into the settings'
    database (results and studies).

    Args:
        targets: the problems, without their GPU (named after the worker's).
        options: how to search; the architecture, worker index and build batch are set here.
        arch: the nvcc architecture; None for the GPU's.
        device: the CUDA device index.
        job_timeout: seconds before a hung measurement is killed.
        target_ms: timing: repeat each config's launches for about this long.

    Raises:
        NoWorkerError: the worker could not start (no GPU, no torch, no driver).
        UnsupportedArchError: the GPU's architecture is not supported and no ``arch`` given.
    """
    from core.settings import get_settings
    from db.store import Store
    from measure.jobs import MeasureOptions
    from measure.timing import TimingOptions
    from measure.worker import BenchWorker, WorkerStartError

    settings = get_settings()
    timing = MeasureOptions(timing=TimingOptions(target_ms=target_ms))
    quiet_optuna()
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
        log.debug("worker start failed", exc_info=True)
        raise NoWorkerError(f"no GPU worker on device {device}: {worker_error(exc)}") from None


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
        UnsupportedArchError: when the GPU's architecture is not supported.
        WorkerStartError: when the worker cannot start (no GPU, no torch).
    """
    from codegen.targets import SUPPORTED_ARCHS, runs_on
    from measure.gpuinfo import arch_for, current_gpu_info, describe_limits

    storage_url = search.resolve_storage_url(db_url)
    gpu = worker.gpu_info or current_gpu_info(device)
    target = arch or arch_for(gpu)
    if target is None:
        raise UnsupportedArchError(
            f"fa2tune has no code a GPU of compute capability {gpu.compute_capability} runs "
            f"(targets: {', '.join(SUPPORTED_ARCHS)}; machine code runs only within its major "
            "version)"
        )
    if not runs_on(target, gpu.compute_capability):
        raise UnsupportedArchError(
            f"{target} code does not run on {gpu.name} (compute capability "
            f"{gpu.compute_capability}); leave --arch out to build for the GPU"
        )
    log.info("%s", describe_limits(gpu, target))
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


def tune_replay(
    table: ReplayTable,
    problems: list[Problem],
    options: CampaignOptions,
    db_url: str | None = None,
    source: Path | None = None,
) -> CampaignSummary:
    """Run the campaign of ``problems`` answered from ``table`` (no GPU, no nvcc).

    Args:
        table: the recorded outcomes.
        problems: the table's problems to tune, in order.
        options: how to search.
        db_url: where the results and studies go (a rerun resumes them); None for a scratch
            database deleted at exit: replayed results are not measurements and go to a real
            database only when one is named on the command line (not from the environment's
            ``FA2TUNE_DB_URL``).
        source: the table's file, for the log.
    """
    from tuner.replay import run_replay_campaign

    dtypes = {p.dtype for p in problems}
    log.info(
        "replaying %d problems (%s) from %s", len(problems), ", ".join(dtypes), source or "table"
    )
    quiet_optuna()
    if db_url is not None:
        log.info("replay results and studies go to %s", db_url)
    with RichProgress() as progress:
        return run_replay_campaign(
            table, options, store=db_url, problems=problems, progress=progress
        )


def report(summary: CampaignSummary, summary_json: Path | None = None) -> None:
    """Show the campaign's summary, and write it as JSON to ``summary_json`` when given."""
    render_summary(summary)
    if summary_json is not None:
        summary_json.write_text(json.dumps(summary.to_dict(), indent=1) + "\n", encoding="utf-8")
