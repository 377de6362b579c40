"""The ``fa2tune`` command: one sub-command per job, each implemented in its stage's package.

This module only assembles the typer application; the work lives in ``codegen.commands``,
``measure.commands``, ``tuner.tune_cli``, ``db.commands`` and ``service.commands``.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import sys
import traceback
from pathlib import Path
from typing import IO, Annotated, Any

import typer
import typer.core
from pydantic import ValidationError
from sqlalchemy import exc as sa_exc
from sqlalchemy import make_url

from codegen import commands as codegen_commands
from core.settings import Settings, get_settings, override_settings
from db import commands as db_commands
from db.session import DatabaseOpenError
from fa2tune import warmup_cli
from measure import commands as measure_commands
from service import commands as service_commands
from tuner import replay_cli, tune_cli

# SQLite's own words for the usual ways a file fails to be a usable database, and what they
# mean to someone who just typed --db.
_SQLITE_HINTS = {
    "unable to open database file": "cannot open the database file (missing or unwritable "
    "directory, or not a file?)",
    "file is not a database": "the file is not an SQLite database",
    "database disk image is malformed": "the SQLite file is damaged (database disk image is "
    "malformed)",
    "attempt to write a readonly database": "the database is read-only (attempt to write a "
    "readonly database)",
}


def _shown_url(url: str) -> str:
    """``url`` as it may be printed: without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (sa_exc.ArgumentError, ValueError):
        return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _database_problem(exc: BaseException) -> str:
    """The words for a database error, without the URL."""
    if isinstance(exc, sa_exc.NoSuchModuleError):
        scheme = str(exc).rpartition(":")[2].strip() or "?"
        return (
            f"unknown database URL scheme {scheme!r} "
            "(use sqlite:///PATH or postgresql://USER@HOST/DB)"
        )
    if isinstance(exc, sa_exc.ArgumentError):
        return f"not a database URL ({_one_line(str(exc))}; use sqlite:///PATH or postgresql://...)"
    if isinstance(exc, sa_exc.DBAPIError):
        orig = exc.orig
        text = _one_line(str(orig)) or type(orig).__name__
        if isinstance(orig, sqlite3.Error):
            text = _SQLITE_HINTS.get(text, text)
        return text
    if isinstance(exc, sqlite3.Error):
        text = _one_line(str(exc))
        return _SQLITE_HINTS.get(text, text)
    lines = str(exc).splitlines()  # SQLAlchemy's own errors end in a "Background" link line
    return _one_line(lines[0] if lines else "") or type(exc).__name__


def _alembic_error() -> type[Exception] | None:
    # Only when alembic is loaded (it cannot have raised otherwise): importing it logs at INFO.
    module = sys.modules.get("alembic.util.exc")
    error = getattr(module, "CommandError", None)
    return error if isinstance(error, type) and issubclass(error, Exception) else None


def describe_error(exc: BaseException, db_url: str | None) -> str | None:
    """One line for a database, file-system or connection error; None for anything else.

    Args:
        exc: the exception a sub-command raised.
        db_url: the database URL the command was given (named in database errors).
    """
    where = f"database {_shown_url(db_url)}" if db_url is not None else "database"
    alembic_error = _alembic_error()
    if isinstance(exc, DatabaseOpenError):
        return f"{where}: {exc}"
    if isinstance(exc, sa_exc.SQLAlchemyError | sqlite3.Error):
        return f"{where}: {_database_problem(exc)}"
    if alembic_error is not None and isinstance(exc, alembic_error):
        return f"{where}: schema migration failed: {_one_line(str(exc))}"
    if isinstance(exc, ValidationError) and exc.title == Settings.__name__:
        # A bad FA2TUNE_* variable: one line per setting, named as the user set it.
        return "; ".join(
            f"setting FA2TUNE_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']} "
            f"(got {e.get('input')!r})"
            for e in exc.errors()
        )
    if isinstance(exc, OverflowError):
        return f"value out of range: {_one_line(str(exc))}"
    if isinstance(exc, OSError):
        if exc.filename is not None:
            names = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "")
            return f"{names}: {exc.strerror or exc}"
        return _one_line(str(exc)) or type(exc).__name__
    return None


# click's UsageError, the base of every bad-argument error. Taken from typer's public
# BadParameter because typer vendors its own copy of click from 0.2x on: the click package's
# UsageError, where installed at all, is then another class.
_USAGE_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)


class _OneLineUsageError(typer.BadParameter):
    """A usage error shown as one line, ``fa2tune best: Invalid value for '--d': ...``.

    Click's own form is four lines (usage, hint, blank, error); typer's rich form puts the
    message in a box wrapped at the terminal width, which splits it and hides it from grep.
    """

    def __init__(self, line: str, ctx: Any, exit_code: int) -> None:
        super().__init__(line, ctx=ctx)
        self.line = line
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        typer.echo(self.line, file=file, err=file is None)


def _one_line_usage(error: Exception) -> Exception:
    """``error`` as a :class:`_OneLineUsageError` when it is a usage error worth rewording."""
    # NoArgsIsHelpError is a UsageError whose "message" is the help page: shown as it is.
    if (
        not isinstance(error, _USAGE_ERROR)
        or isinstance(error, _OneLineUsageError)
        or type(error).__name__ == "NoArgsIsHelpError"
    ):
        return error
    ctx = getattr(error, "ctx", None)
    message = _one_line(error.format_message())  # type: ignore[attr-defined]
    if ctx is not None:
        path = ctx.command_path
        message = f"{path}: {message} (see '{path} --help')"
    return _OneLineUsageError(message, ctx, getattr(error, "exit_code", 2))


class _CleanErrors(typer.core.TyperGroup):
    """The one error path of the CLI: database, file-system and connection errors end the
    command with one line on stderr and exit status 1 (the traceback too with ``-v``).

    Usage errors keep exit status 2 and are shown as one line too; other exceptions are bugs
    and keep their traceback.
    """

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        # The global options are parsed here; the sub-command's inside invoke().
        try:
            return super().make_context(info_name, args, parent, **extra)
        except _USAGE_ERROR as error:
            raise _one_line_usage(error) from error

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _USAGE_ERROR as error:
            raise _one_line_usage(error) from error
        except Exception as exc:
            from core.settings import get_settings

            try:
                db_url: str | None = get_settings().db_url
            except Exception:  # a bad setting must not hide the error being reported
                db_url = None
            message = describe_error(exc, db_url)
            if message is None:
                raise
            if ctx.params.get("verbose"):
                typer.echo(traceback.format_exc().rstrip(), err=True)
            command = " ".join(filter(None, ("fa2tune", ctx.invoked_subcommand)))
            typer.echo(f"{command}: {message}", err=True)
            raise typer.Exit(code=1) from None


app = typer.Typer(
    cls=_CleanErrors,
    name="fa2tune",
    help=(
        "Autotune FlashAttention-2 forward kernels on this GPU, store the results, "
        "serve the best config over HTTP and export a tuned CUDA header."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click output: typer then calls the usage error's own show() (one line, above)
    # instead of drawing a box; help pages lose their boxes too, and stay greppable.
    rich_markup_mode=None,
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
app.command("replay-table")(replay_cli.replay_table)
app.command("warmup")(warmup_cli.warmup)
app.command("serve")(service_commands.serve)
app.command("export")(service_commands.export)

if __name__ == "__main__":
    app()
