"""CLI sub-commands of the db stage: ``best``, ``dump`` and ``ingest``.

They open the database named by the settings (``FA2TUNE_DB_URL`` or the global ``--db``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from codegen import fa3_space
from core.config import DTYPES, HEAD_DIMS
from db.dump_format import TransferError
from db.results import BestResult
from db.shipped import load_shipped_results
from db.store import Store
from db.transfer import dump as dump_results
from db.transfer import export, ingest_file, to_json
from fa2tune.settings import get_settings

logger = logging.getLogger(__name__)

MAX_N = 2**31 - 1  # the kernel's sequence lengths, batch and heads are int32 (Fa2Params)
# Every family's head dims (fa2: core.config.HEAD_DIMS, fa3: codegen.fa3_space.HEAD_DIMS).
SUPPORTED_HEAD_DIMS: tuple[int, ...] = tuple(sorted({*HEAD_DIMS, *fa3_space.HEAD_DIMS}))


def _check_d(d: int) -> int:
    if d not in SUPPORTED_HEAD_DIMS:
        raise typer.BadParameter(
            f"{d} is not a supported head dim; use one of "
            f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))} "
            f"(fa2: {', '.join(map(str, HEAD_DIMS))}; "
            f"fa3: {', '.join(map(str, fa3_space.HEAD_DIMS))})",
            param_hint="--d",
        )
    return d


def _cannot_write(path: Path, exc: OSError) -> OSError:
    """The error for a file that cannot be written, worded for the CLI's one line."""
    why = exc.strerror or str(exc)
    if isinstance(exc, FileExistsError) and exc.filename and not Path(exc.filename).is_dir():
        why = f"{exc.filename} is not a directory"  # mkdir(exist_ok=True) on a file
    return OSError(f"cannot write {path}: {why}")


def _open_store() -> Store:
    return Store.from_url(get_settings().db_url)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _best_table(result: BestResult) -> Table:
    config = result.config
    mask = "causal" if result.causal else "full"
    where = (
        f"N={result.n}"
        if result.exact
        else f"N={result.from_n} (nearest tuned N; exact N not tuned)"
    )
    table = Table(title=f"best on {result.gpu}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("config", config.name),
        ("family", config.family),
        ("tile", config.describe()),
        (
            "problem",
            f"D={result.d} {result.dtype} {mask}, batch {result.batch} x "
            f"{result.heads} heads ({result.kv_heads} kv), Nk={result.nk}",
        ),
        ("measured at", where),
        (
            "median",
            f"{_fmt(result.median_ms, '.4f')} ms "
            f"(p10 {_fmt(result.p10_ms, '.4f')}, p90 {_fmt(result.p90_ms, '.4f')})",
        ),
        ("TFLOP/s", _fmt(result.tflops, ".1f")),
        ("registers", "-" if result.registers is None else str(result.registers)),
        ("spills", f"{result.spill_stores} B stores, {result.spill_loads} B loads"),
        ("build", f"{result.arch}, {result.nvcc_version}, source {result.source_hash}"),
        (
            "device",
            f"{result.gpu} (cc {result.compute_capability}), driver "
            f"{result.driver_version}, CUDA {result.cuda_version}",
        ),
        ("measured on", result.measured_at.isoformat(timespec="seconds")),
    ]
    for field, value in rows:
        table.add_row(field, value)
    return table


def best(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name, e.g. H200 or 'NVIDIA H200'")],
    d: Annotated[
        int,
        typer.Option(
            "--d",
            help=f"head dimension ({', '.join(map(str, SUPPORTED_HEAD_DIMS))})",
            callback=_check_d,
        ),
    ],
    n: Annotated[
        int, typer.Option("--n", help="sequence length (queries = keys)", min=1, max=MAX_N)
    ],
    dtype: Annotated[str, typer.Option("--dtype", help="fp16 or bf16")] = "fp16",
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="causal mask")] = False,
    batch: Annotated[
        int | None, typer.Option("--batch", help="only this batch size", min=1, max=MAX_N)
    ] = None,
    heads: Annotated[
        int | None, typer.Option("--heads", help="only this head count", min=1, max=MAX_N)
    ] = None,
    exact: Annotated[
        bool, typer.Option("--exact", help="no fallback to the nearest tuned N")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Show the fastest correct config measured for a GPU and problem."""
    if dtype not in DTYPES:
        raise typer.BadParameter(f"must be one of {', '.join(DTYPES)}", param_hint="--dtype")
    with _open_store() as store:
        try:
            load_shipped_results(store)
        except TransferError as exc:  # a broken package must not hide the user's own results
            logger.error("shipped results not loaded: %s", exc)
        lookup = store.best if exact else store.best_or_nearest
        result = lookup(gpu, d, n, dtype, causal, batch=batch, heads=heads)
    if result is None:
        mask = "causal" if causal else "non-causal"
        typer.echo(
            f"no successful measurement for {gpu} D={d} N={n} {dtype} {mask}"
            f"{'' if exact else ' at any N'}; tune it first (fa2tune tune) "
            "or ingest results (fa2tune ingest)",
            err=True,
        )
        raise typer.Exit(code=1)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        Console().print(_best_table(result))


def dump(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="file to write (default: standard output)", dir_okay=False
        ),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="only this GPU's results")] = None,
) -> None:
    """Write the results database (or one GPU's results) as a portable JSON file."""
    with _open_store() as store:
        if output is None:
            data = export(store, gpu)
            typer.echo(to_json(data))
        else:
            try:
                data = dump_results(store, output, gpu)
            except OSError as exc:  # the CLI prints it as one line (fa2tune.cli)
                raise _cannot_write(output, exc) from exc
    where = "standard output" if output is None else str(output)
    typer.echo(
        f"dumped {len(data.measurements)} measurements, {len(data.builds)} builds, "
        f"{len(data.problems)} problems, {len(data.gpus)} GPUs to {where}",
        err=True,
    )


def ingest(
    path: Annotated[
        Path,
        typer.Argument(
            help="results file written by 'fa2tune dump'",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
) -> None:
    """Add the results of a dump file to the database (idempotent; all or nothing)."""
    with _open_store() as store:
        try:
            summary = ingest_file(store, path)
        except TransferError as exc:
            typer.echo(f"{path}: {exc}\nnothing was ingested", err=True)
            raise typer.Exit(code=2) from exc
    typer.echo(
        f"added {summary.added} measurements, skipped {summary.skipped} already present "
        f"({summary.gpus_added} GPUs, {summary.builds_added} builds, "
        f"{summary.problems_added} problems added)"
    )
