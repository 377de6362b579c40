"""Placeholder for sub-commands whose stage has not landed yet: says so and exits non-zero."""

from __future__ import annotations

import typer


def not_built(name: str) -> None:
    """Tell the user the sub-command is not implemented yet and exit with status 2."""
    typer.echo(f"fa2tune {name}: not built yet", err=True)
    raise typer.Exit(code=2)
