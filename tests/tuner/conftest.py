"""The tuner tests' shared fixture: the ``tune`` command under a root command, as ``fa2tune``
runs it (with the global ``--db`` that ``tune`` reads from the root context)."""

from __future__ import annotations

from typing import Annotated

import pytest
import typer

from tuner.tune_cli import tune


@pytest.fixture
def app() -> typer.Typer:
    """``tune`` under a root command with the global ``--db``, as ``fa2tune`` has."""
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def main(db: Annotated[str | None, typer.Option("--db")] = None) -> None:
        """Test app."""

    app.command("tune")(tune)
    return app
