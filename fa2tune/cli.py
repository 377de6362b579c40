"""The ``fa2tune`` command: one sub-command per job, each implemented in its stage's package.

This module only assembles the typer application; the work lives in ``codegen.commands``,
``measure.commands``, ``tuner.tune_cli``, ``db.commands`` and ``service.commands``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from codegen import commands as codegen_commands
from db import commands as db_commands
from fa2tune.settings import get_settings, override_settings
from measure import commands as measure_commands
from service import commands as service_commands
from tuner import tune_cli

app = typer.Typer(
    name="fa2tune",
    help=(
        "Autotune FlashAttention-2 forward kernels on this GPU, store the results, "
        "serve the best config over HTTP and export a tuned CUDA header."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main(
    db: Annotated[
        str | None, typer.Option("--db", help="SQLAlchemy database URL (env FA2TUNE_DB_URL)")
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="build cache directory (env FA2TUNE_CACHE_DIR)"),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False,
) -> None:
    """Global options apply to every sub-command."""
    override_settings(db_url=db, cache_dir=cache_dir)
    level = "DEBUG" if verbose else get_settings().log_level
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


app.command("space")(codegen_commands.space)
app.command("build")(codegen_commands.build)
app.command("bench")(measure_commands.bench)
app.command("tune")(tune_cli.tune)
app.command("best")(db_commands.best)
app.command("dump")(db_commands.dump)
app.command("ingest")(db_commands.ingest)
app.command("serve")(service_commands.serve)
app.command("export")(service_commands.export)

if __name__ == "__main__":
    app()
