"""``fa2tune replay-table``: a database's measurements as a replay table for ``tune --replay``.

A replay table (:mod:`tuner.replay_table`) answers a campaign from recorded outcomes instead
of the GPU, so samplers and search changes can be compared on a machine without one
(``fa2tune tune --replay``, ``bench/compare_samplers.py``). This command writes one from the
database (``--db``/``FA2TUNE_DB_URL``), with the shipped results loaded unless
``--no-shipped``: on a fresh install, ``fa2tune replay-table --gpu H200 -o h200.json`` gives
the H200 campaigns' outcomes as a table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from core.settings import get_settings
from db.dump_format import TransferError
from db.shipped import load_shipped_results
from db.store import Store
from tuner.replay_table import export_replay_table

log = logging.getLogger(__name__)


def replay_table(
    gpu: Annotated[str, typer.Option("--gpu", help="the GPU whose measurements to write")],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="file to write (default: standard output)", dir_okay=False
        ),
    ] = None,
    shipped: Annotated[
        bool,
        typer.Option(
            "--shipped/--no-shipped", help="load the shipped results into the database first"
        ),
    ] = True,
) -> None:
    """Write one GPU's measurements as a replay table (for fa2tune tune --replay)."""
    with Store.from_url(get_settings().db_url) as store:
        if shipped:
            try:
                load_shipped_results(store)
            except TransferError as exc:  # a broken package must not hide the user's own
                log.error("shipped results not loaded: %s", exc)
        try:
            table = export_replay_table(store, gpu)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--gpu") from None
    text = json.dumps(table, indent=1) + "\n"
    if output is None:
        typer.echo(text, nl=False)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(f"cannot write {output}: {exc.strerror}",
                                     param_hint="--output") from None  # fmt: skip
    problems = table["problems"]
    assert isinstance(problems, dict)
    outcomes = sum(len(p["configs"]) for p in problems.values())
    where = "standard output" if output is None else str(output)
    typer.echo(f"wrote {len(problems)} problems, {outcomes} outcomes to {where}", err=True)
