"""``fa2tune warmup --workload FILE``: build ahead the kernels a workload's calls will run
(:mod:`fa2tune.ops.warmup`), for the local GPU or one named with ``--gpu``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from codegen.build import NvccNotFoundError, report_to_dict
from codegen.targets import SUPPORTED_ARCHS, compute_capability_of, target_for
from core.build_report import BuildReport, BuildStatus
from core.gpu_name import normalize_gpu_name
from db.store import Store
from fa2tune.ops.choice import open_store
from fa2tune.ops.warmup import GpuTarget, Planned, build_planned, plan
from tuner.cli_values import bad_option
from tuner.workload import Target, WorkloadError, load_workload

log = logging.getLogger(__name__)

_BUILT = (BuildStatus.OK, BuildStatus.SPILLS)


def _named_gpu(store: Store | None, gpu: str, arch: str | None, sms: int | None) -> GpuTarget:
    """The named GPU: its SM count and compute capability from the options, else from the
    database's record of it."""
    known = None
    if store is not None:
        key = normalize_gpu_name(gpu)
        known = next((g for g in store.gpus() if normalize_gpu_name(g.name) == key), None)
    if arch is not None and arch not in SUPPORTED_ARCHS:
        raise bad_option("--arch", f"{arch!r} is not one of {', '.join(SUPPORTED_ARCHS)}")
    cc = compute_capability_of(arch) if arch is not None else None
    if known is not None:
        return GpuTarget(known.name, sms or known.sm_count, cc or known.compute_capability)
    if cc is None or sms is None:
        raise bad_option(
            "--gpu",
            f"the database has no GPU {gpu!r}: give its --arch and --sms (SM count) as well",
        )
    return GpuTarget(gpu, sms, cc)


def _local_gpu(device: int) -> GpuTarget:
    try:
        from measure.gpuinfo import current_gpu_info

        info = current_gpu_info(device)
    except (ImportError, RuntimeError) as exc:
        raise bad_option(
            "--gpu", f"no local GPU to decide for ({exc}); name one with --gpu and --arch"
        ) from None
    return GpuTarget(info.name, info.sm_count, info.compute_capability)


def _table(planned: list[Planned], reports: dict[str, BuildReport]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=f"{len(planned)} calls")
    for column in ("call", "config", "choice", "build"):
        table.add_column(column)
    for p in planned:
        call = (f"{p.target.label}: " if p.target.label else "") + p.target.describe()
        if p.choice is None:
            table.add_row(call, "-", "SDPA fallback", p.reason)
            continue
        r = reports[p.choice.config.name]
        status = str(r.status) + ("" if r.status in _BUILT else f": {r.error or ''}")
        table.add_row(call, p.choice.config.name, p.choice.source, status)
    return table


def warmup(
    workload: Annotated[
        list[Path], typer.Option("--workload", help="workload file (YAML/JSON); repeatable")
    ],
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help="decide for this GPU (by name) instead of the local one"),
    ] = None,
    arch: Annotated[
        str | None, typer.Option("--arch", help="with --gpu: its target (else the database's)")
    ] = None,
    sms: Annotated[
        int | None,
        typer.Option("--sms", help="with --gpu: its SM count (else the database's)", min=1),
    ] = None,
    device: Annotated[int, typer.Option("--device", help="local GPU index", min=0)] = 0,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", help="parallel compiler jobs (env FA2TUNE_BUILD_JOBS)", min=1),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """Build ahead the kernels a workload's calls will run, into the cache fa2tune.torch reads.

    Each call gets the op's own decision (the database's tuned answer, exact or nearest,
    else the default); nothing is launched. Exit 1 when a build fails.
    """
    targets: list[Target] = []
    for path in workload:
        try:
            targets.extend(load_workload(path).targets)
        except WorkloadError as exc:
            raise bad_option("--workload", str(exc)) from None
    store = open_store()
    chosen = _named_gpu(store, gpu, arch, sms) if gpu is not None else _local_gpu(device)
    target_arch = target_for(chosen.compute_capability)
    if target_arch is None:
        raise bad_option(
            "--gpu", f"fa2tune has no code for compute capability {chosen.compute_capability}"
        )
    planned = plan(store, list(dict.fromkeys(targets)), chosen)
    try:
        batch = build_planned(planned, target_arch, jobs)
    except NvccNotFoundError as exc:
        typer.echo(f"fa2tune warmup: {exc}", err=True)
        raise typer.Exit(code=1) from None
    reports = {r.config.name: r for r in batch.reports}
    if as_json:
        rows = [
            {
                "call": p.target.describe(),
                "label": p.target.label,
                "choice": p.choice.source if p.choice is not None else None,
                "fallback": p.reason or None,
                "build": report_to_dict(reports[p.choice.config.name]) if p.choice else None,
            }
            for p in planned
        ]
        typer.echo(json.dumps(rows, indent=1))
    else:
        console = Console(soft_wrap=True)
        console.print(_table(planned, reports))
        console.print(
            f"{chosen.name} ({target_arch}): {len(reports)} configs, {batch.built} built, "
            f"{batch.cached} cached, {batch.failed} failed in {batch.seconds:.1f} s"
        )
    if batch.failed:
        raise typer.Exit(code=1)
