"""CLI sub-commands of the measurement stage: ``fa2tune bench``."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Annotated

import typer

log = logging.getLogger(__name__)

MAX_N = 2**31 - 1  # FaParams' lengths, batch and heads are int32


def missing_gpu_packages() -> list[str]:
    """The packages the GPU worker imports that this interpreter cannot find (torch,
    cuda-bindings), by their pip names."""
    missing = []
    for module, package in (("torch", "torch"), ("cuda.bindings", "cuda-bindings")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a dotted name whose parent package is absent
            found = False
        if not found:
            missing.append(package)
    return missing


def bench(
    config: Annotated[
        str,
        typer.Option(
            "--config", help="kernel config name, e.g. fa2_d128_fp16_full_br128_bc64_w4_s1_pad8"
        ),
    ],
    n: Annotated[
        int, typer.Option("--n", min=1, max=MAX_N, help="query length (and key length)")
    ] = 4096,
    nk: Annotated[
        int | None,
        typer.Option("--nk", min=1, max=MAX_N, help="key length when it differs from --n"),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=MAX_N, help="batch size")] = 2,
    heads: Annotated[int, typer.Option("--heads", min=1, max=MAX_N, help="query heads")] = 16,
    kv_heads: Annotated[
        int | None,
        typer.Option("--kv-heads", min=1, max=MAX_N, help="key/value heads (GQA); default --heads"),
    ] = None,
    layout: Annotated[
        str, typer.Option("--layout", help="tensor layout: bnhd ([B,N,H,D]) or bhnd ([B,H,N,D])")
    ] = "bnhd",
    arch: Annotated[str, typer.Option("--arch", help="nvcc target architecture")] = "sm_90",
    sdpa: Annotated[
        bool,
        typer.Option("--sdpa", help="also time torch SDPA flash, efficient and cuDNN backends"),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    device: Annotated[int, typer.Option("--device", min=0, help="CUDA device index")] = 0,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="seconds without progress before a hang")
    ] = 60.0,
    target_ms: Annotated[
        float, typer.Option("--target-ms", min=1.0, help="kernel time to spend timing")
    ] = 200.0,
    warm_l2: Annotated[
        bool, typer.Option("--warm-l2", help="do not flush L2 between timed launches")
    ] = False,
    cubin: Annotated[
        Path | None,
        typer.Option("--cubin", exists=True, dir_okay=False, help="use this cubin, do not build"),
    ] = None,
    symbol: Annotated[
        str | None, typer.Option("--symbol", help="kernel symbol in --cubin (default: the name)")
    ] = None,
    handler: Annotated[
        str | None, typer.Option("--handler", hidden=True, help="worker job handler (tests)")
    ] = None,
) -> None:
    """Build, verify and time one config on one problem (optionally against torch SDPA).

    Exit status: 0 when the config measured OK; 1 when it did not (build failure, wrong result,
    crash, hang) or no GPU worker could start; 2 on bad arguments.
    """
    from core.family import config_from_name
    from measure.bench import render, run_bench
    from measure.params import LAYOUTS
    from measure.timing import TimingOptions
    from measure.worker import DEFAULT_HANDLER, WorkerStartError

    try:
        cfg = config_from_name(config)
    except ValueError as exc:
        typer.echo(f"fa2tune bench: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    if layout not in LAYOUTS:
        typer.echo(f"fa2tune bench: --layout must be one of {', '.join(LAYOUTS)}", err=True)
        raise typer.Exit(code=2)
    if kv_heads is not None and heads % kv_heads != 0:
        typer.echo(
            f"fa2tune bench: --heads {heads} is not a multiple of --kv-heads {kv_heads}", err=True
        )
        raise typer.Exit(code=2)
    missing = missing_gpu_packages() if handler is None else []
    if missing:
        # The worker child would die importing them and print its traceback; say it once.
        typer.echo(
            f"fa2tune bench: needs {' and '.join(missing)} on this machine (install the gpu "
            "extra: pip install 'fa2tune[gpu]')",
            err=True,
        )
        raise typer.Exit(code=1)
    try:
        report = run_bench(
            cfg,
            n=n,
            nk=nk,
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
            layout=layout,
            arch=arch,
            sdpa=sdpa,
            device=device,
            job_timeout_s=timeout,
            timing=TimingOptions(target_ms=target_ms, flush_l2=not warm_l2),
            cubin=cubin,
            symbol=symbol,
            handler=handler or DEFAULT_HANDLER,
        )
    except WorkerStartError as exc:
        typer.echo(f"fa2tune bench: no GPU worker: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    except ImportError as exc:
        typer.echo(f"fa2tune bench: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    if json_out:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        import shutil

        from rich.console import Console

        # Piped output would otherwise be cut to 80 columns and wrap the table.
        render(report, Console(width=max(100, shutil.get_terminal_size((100, 24)).columns)))
    if not report.ok:
        raise typer.Exit(code=1)
