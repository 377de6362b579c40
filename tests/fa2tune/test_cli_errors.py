"""The CLI's one error path and its input bounds (issue 15), through the real typer app.

Database, file-system and connection errors end a command with one line on stderr naming the
URL or path, and exit status 1; ``-v`` adds the traceback. Bad arguments stay usage errors
(exit status 2). CPU only; the PostgreSQL cases need no server except the one marked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from core.problem import Problem
from db.session import DatabaseURLError, make_engine
from db.store import Store
from db.transfer import dump
from fa2tune.cli import app
from tests.support.factories import make_config, ok_result, seed_measurement

runner = CliRunner()
BEST = ["best", "--gpu", "H200", "--d", "128", "--n", "4096"]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    # --db is a process-wide override; keep the package's shipped results out of the stores.
    monkeypatch.setattr("core.settings._overrides", {})
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [])


def _seeded(url: str) -> str:
    with Store.from_url(url) as store:
        problem = Problem(gpu="H200", d=128, n=4096)
        seed_measurement(store, problem=problem, config=make_config(), result=ok_result(0.5))
    return url


def _one_line_failure(result: Result, *fragments: str) -> str:
    """Assert exit status 1 and exactly one line on stderr, holding ``fragments``."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("fa2tune "), line
    for fragment in fragments:
        assert fragment in line, line
    return line


# ---------------------------------------------------------------- databases


def test_missing_directory_is_created(tmp_path: Path) -> None:
    """A SQLite file in a directory that does not exist yet: the directory is made (the default
    database lives in a per-user data directory that a first run has to create)."""
    path = tmp_path / "new" / "dir" / "fa2tune.db"
    result = runner.invoke(app, ["--db", f"sqlite:///{path}", *BEST])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("no successful measurement"), result.stderr
    assert path.is_file()


@pytest.mark.parametrize("under", ["", "sub"])
def test_directory_that_cannot_be_made(tmp_path: Path, under: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    url = f"sqlite:///{blocker / under / 'fa2tune.db'}"
    result = runner.invoke(app, ["--db", url, *BEST])
    line = _one_line_failure(
        result, f"fa2tune best: database {url}: cannot create the database's directory"
    )
    assert line.endswith(("Not a directory", f"{blocker} is not a directory")), line


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_read_only_location(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes through permission bits; /proc takes no new files
        where = Path("/proc") / f"fa2tune-{os.getpid()}.db"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        where = ro / "fa2tune.db"
    url = f"sqlite:///{where}"
    result = runner.invoke(app, ["--db", url, *BEST])
    _one_line_failure(result, f"database {url}: cannot open the database file")


def test_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "random.db"
    path.write_bytes(os.urandom(8192))
    url = f"sqlite:///{path}"
    result = runner.invoke(app, ["--db", url, *BEST])
    _one_line_failure(result, f"database {url}: the file is not an SQLite database")


def test_half_overwritten_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "fa2tune.db"
    url = _seeded(f"sqlite:///{path}")
    size = path.stat().st_size
    assert size > 8192
    with path.open("r+b") as fh:
        fh.truncate(size // 2)
    result = runner.invoke(app, ["--db", url, *BEST])
    _one_line_failure(result, f"database {url}: the SQLite file is damaged")


@pytest.mark.parametrize("url", ["foo://", "foo://host/db"])
def test_unknown_url_scheme(url: str) -> None:
    result = runner.invoke(app, ["--db", url, *BEST])
    _one_line_failure(result, f"database {url}: unknown database URL scheme 'foo'")


def test_not_a_url() -> None:
    result = runner.invoke(app, ["--db", "no scheme here", *BEST])
    _one_line_failure(result, "database no scheme here: not a database URL")


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("mysql://u@h/db", ("mysql:// URL scheme needs", "MySQLdb", "pip install mysqlclient")),
        ("mssql+pyodbc://u@h/db", ("mssql+pyodbc:// URL scheme needs", "pip install pyodbc")),
        ("oracle://u@h/db", ("oracle:// URL scheme needs", "pip install oracledb")),
    ],
)
def test_driver_not_installed(
    url: str, fragments: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes the import fail as for a module that is not installed, on a
    # machine that happens to have the driver too.
    for module in ("MySQLdb", "pyodbc", "oracledb", "cx_Oracle"):
        monkeypatch.setitem(sys.modules, module, None)
    result = runner.invoke(app, ["--db", url, *BEST])
    line = _one_line_failure(result, f"fa2tune best: database {url}: the ", *fragments)
    assert line.endswith("fa2tune works with SQLite and PostgreSQL"), line


def test_postgresql_without_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    url = "postgresql://fa2:secret@db.example/x"
    result = runner.invoke(app, ["--db", url, *BEST])
    line = _one_line_failure(
        result,
        "database postgresql://fa2:***@db.example/x: the postgresql:// URL scheme needs the "
        "Python module psycopg, which is not installed (pip install 'fa2tune[postgres]')",
    )
    assert "secret" not in line


def test_driver_not_installed_verbose_adds_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "MySQLdb", None)
    result = runner.invoke(app, ["-v", "--db", "mysql://u@h/db", *BEST])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "ModuleNotFoundError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("fa2tune best: database mysql://")


@pytest.mark.parametrize("url", ["postgresql+asyncpg://u@h/db", "sqlite+aiosqlite:///x.db"])
def test_asyncio_driver(url: str) -> None:
    result = runner.invoke(app, ["--db", url, *BEST])
    _one_line_failure(result, f"database {url}: ", "asyncio driver, which fa2tune cannot use")


@pytest.mark.parametrize(
    ("url", "shown", "why"),
    [
        ("not a url", "not a url", "Could not parse SQLAlchemy URL"),
        ("postgresql://:@:notaport/x", "postgresql://:***@:notaport/x", "port 'notaport' is not"),
        ("sqlite://relative.db", "sqlite://relative.db", "Invalid SQLite URL"),
    ],
)
def test_unparsable_url(url: str, shown: str, why: str) -> None:
    result = runner.invoke(app, ["--db", url, *BEST])
    _one_line_failure(result, f"database {shown}: not a database URL (", why, "sqlite:///PATH")


def test_unknown_driver_of_a_known_database() -> None:
    result = runner.invoke(app, ["--db", "postgresql+nodriver://u@h/db", *BEST])
    _one_line_failure(result, "unknown database URL scheme 'postgresql+nodriver'")


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("mysql://u@h/db", "pip install mysqlclient"),
        ("foo://", "unknown database URL scheme 'foo'"),
        ("not a url", "not a database URL"),
        ("postgresql://:@:notaport/x", "port 'notaport' is not a number"),
    ],
)
def test_make_engine_raises_one_kind_of_error(
    url: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every way a URL cannot give an engine is a DatabaseURLError (a DatabaseOpenError), so
    the service, the tuner and alembic see the same error the CLI prints."""
    monkeypatch.setitem(sys.modules, "MySQLdb", None)
    with pytest.raises(DatabaseURLError, match=re.escape(match)):
        make_engine(url)


def test_a_missing_driver_through_a_subprocess(tmp_path: Path) -> None:
    """The installed entry point, not the test runner: no traceback reaches the terminal."""
    # A directory on PYTHONPATH that shadows the driver with a module that fails to import as
    # an uninstalled one would.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "MySQLdb.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'MySQLdb'\", name='MySQLdb')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), *sys.path])}
    env.pop("FA2TUNE_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "fa2tune.cli", "--db", "mysql://u@h/db", *BEST],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install mysqlclient" in lines[0], done.stderr


def test_postgresql_refuses_the_connection() -> None:
    url = "postgresql://fa2:secret@127.0.0.1:1/x"  # nothing listens on port 1
    result = runner.invoke(app, ["--db", url, *BEST])
    line = _one_line_failure(
        result, "database postgresql://fa2:***@127.0.0.1:1/x:", "Connection refused"
    )
    assert "secret" not in result.output and "secret" not in line


def test_verbose_adds_the_traceback() -> None:
    result = runner.invoke(app, ["-v", "--db", "foo://", *BEST])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("fa2tune best: database foo://:")


def test_usage_errors_keep_exit_status_2() -> None:
    result = runner.invoke(app, ["--db", "foo://", "best", "--gpu", "H200"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["best", "--gpu", "H200", "--d", "x", "--n", "4096"],
            "fa2tune best: Invalid value for '--d': ",
        ),
        (["best", "--gpu", "H200"], "fa2tune best: Missing option '--d'."),
        (["--bogus", "best"], "fa2tune: No such option: --bogus"),
        (["nocommand"], "fa2tune: No such command 'nocommand'."),
        (
            ["best", "--gpu", "H200", "--d", "12", "--n", "4096"],
            "fa2tune best: Invalid value for --d: 12 is not a supported head dim; use a multiple "
            "of 8 from 8 to 256 (fa3: 64, 96, 128, 256)",
        ),
        (
            ["tune", "--family", "fa3", "--d", "40"],
            "fa2tune tune: Invalid value for '--family': fa3 has no head dim 40 (head dims fa3: "
            "64, 96, 128, 256)",
        ),
    ],
)
def test_usage_errors_are_one_line(args: list[str], line: str) -> None:
    """Exit status 2 and one plain line, however long: no box wrapped at the terminal width."""
    result = runner.invoke(app, args, terminal_width=40)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(line), lines[0]
    assert lines[0].endswith("--help')"), lines[0]
    assert not set("╭│╰─") & set(result.stderr), result.stderr


def test_no_arguments_still_show_the_help() -> None:
    result = runner.invoke(app, [])
    assert "Usage: fa2tune [OPTIONS] COMMAND" in result.output
    assert "best" in result.output and "export" in result.output


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise KeyError("a bug, not a database error")

    monkeypatch.setattr("db.commands._open_store", broken)
    result = runner.invoke(app, BEST)
    assert isinstance(result.exception, KeyError)


# ---------------------------------------------------------------- files written


def test_dump_to_an_unwritable_path(tmp_path: Path) -> None:
    url = _seeded(f"sqlite:///{tmp_path / 'fa2tune.db'}")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "dump.json"
    result = runner.invoke(app, ["--db", url, "dump", "-o", str(out)])
    _one_line_failure(result, f"fa2tune dump: cannot write {out}: {blocker} is not a directory")


def test_export_to_an_unwritable_path(tmp_path: Path) -> None:
    url = _seeded(f"sqlite:///{tmp_path / 'fa2tune.db'}")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "fa2_tuned.cuh"
    result = runner.invoke(app, ["--db", url, "export", "--gpu", "H200", "--d", "128",
                                 "-o", str(out)])  # fmt: skip
    _one_line_failure(result, f"fa2tune export: cannot write {out}: {blocker} is not a directory")


# ---------------------------------------------------------------- ingest


def _dump_with_reps(tmp_path: Path, reps: int) -> Path:
    source = _seeded(f"sqlite:///{tmp_path / 'source.db'}")
    path = tmp_path / "results.json"
    with Store.from_url(source) as store:
        dump(store, path)
    data = json.loads(path.read_text())
    data["measurements"][0]["reps"] = reps
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_ingest_of_an_out_of_range_integer(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """reps = 10**30: rejected by the file's validation (exit 2) or, failing that, by the
    database (exit 1); one line either way, and nothing stored."""
    path = _dump_with_reps(tmp_path, 10**30)
    url = (
        f"sqlite:///{tmp_path / 'target.db'}"
        if backend == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )
    with Store.from_url(url):
        pass  # migrated up front: the migration's log line is not the command's
    result = runner.invoke(app, ["--db", url, "ingest", str(path)])
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output
    assert str(path) in result.stderr or "out of range" in result.stderr, result.stderr
    if result.exit_code == 1:
        _one_line_failure(result, "fa2tune ingest:")
    with Store.from_url(url) as store:
        assert store.best("H200", 128, 4096, "fp16", False) is None


def test_overflow_during_ingest_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error path itself, whatever validation comes before the database."""

    def overflow(*_args: object) -> None:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    monkeypatch.setattr("db.commands.ingest_file", overflow)
    path = _dump_with_reps(tmp_path, 1)
    result = runner.invoke(app, ["--db", f"sqlite:///{tmp_path / 't.db'}", "ingest", str(path)])
    _one_line_failure(result, "fa2tune ingest: value out of range: Python int too large")


# ---------------------------------------------------------------- input bounds


def _usage_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    flat = " ".join(result.stderr.replace("│", " ").split())
    for fragment in fragments:
        assert fragment in flat, flat


@pytest.mark.parametrize("d", ["65", "0", "7", "12", "264", "512"])
def test_best_rejects_an_unsupported_head_dim(tmp_path: Path, d: str) -> None:
    url = f"sqlite:///{tmp_path / 'fa2tune.db'}"
    result = runner.invoke(app, ["--db", url, "best", "--gpu", "H200", "--d", d, "--n", "4096"])
    _usage_error(result, f"{d} is not a supported head dim", "a multiple of 8 from 8 to 256")
    assert "no successful measurement" not in result.output


@pytest.mark.parametrize("d", ["40", "80", "160", "192"])
def test_best_takes_any_multiple_of_8(tmp_path: Path, d: str) -> None:
    """Accepted: nothing tuned there yet is the answer, not a usage error."""
    url = f"sqlite:///{tmp_path / 'fa2tune.db'}"
    result = runner.invoke(app, ["--db", url, "best", "--gpu", "H200", "--d", d, "--n", "4096"])
    assert result.exit_code == 1, result.output
    assert "is not a supported head dim" not in result.output


@pytest.mark.parametrize(
    ("n", "why"),
    [
        ("99999999999", "less than or equal to 2147483647"),
        (str(2**31), "less than or equal to 2147483647"),
        ("0", "greater than or equal to 1"),
        ("-5", "greater than or equal to 1"),
    ],
)
def test_best_rejects_n_outside_the_kernel_limit(tmp_path: Path, n: str, why: str) -> None:
    url = f"sqlite:///{tmp_path / 'fa2tune.db'}"
    result = runner.invoke(app, ["--db", url, "best", "--gpu", "H200", "--d", "128", "--n", n])
    _usage_error(result, "--n", why)


def test_best_takes_n_at_the_limit(tmp_path: Path) -> None:
    url = _seeded(f"sqlite:///{tmp_path / 'fa2tune.db'}")
    result = runner.invoke(app, ["--db", url, "best", "--gpu", "H200", "--d", "128",
                                 "--n", str(2**31 - 1), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["from_n"] == 4096


@pytest.mark.parametrize("option", ["--n", "--nk", "--batch", "--heads", "--kv-heads"])
@pytest.mark.parametrize(
    ("value", "why"),
    [("99999999999", "less than or equal to 2147483647"), ("0", "greater than or equal to 1")],
)
def test_bench_rejects_sizes_outside_the_kernel_limit(option: str, value: str, why: str) -> None:
    name = make_config().name
    result = runner.invoke(app, ["bench", "--config", name, option, value])
    _usage_error(result, option, why)


# ------------------------------------------------------------------ issue 26: first contact


def test_bad_setting_in_the_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # It was a 49-line pydantic traceback.
    monkeypatch.setenv("FA2TUNE_PORT", "abc")
    from core import settings

    settings._from_environment.cache_clear()
    try:
        result = runner.invoke(app, ["--db", f"sqlite:///{tmp_path / 'x.db'}", *BEST])
    finally:
        monkeypatch.delenv("FA2TUNE_PORT")
        settings._from_environment.cache_clear()
    line = _one_line_failure(result, "FA2TUNE_PORT", "'abc'")
    assert "valid integer" in line


def test_serve_on_a_busy_port_fails_before_opening_the_database(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        db = tmp_path / "never.db"
        result = runner.invoke(app, ["--db", f"sqlite:///{db}", "serve", "--port", str(port)])
    _one_line_failure(result, f"cannot listen on 127.0.0.1:{port}")
    assert not db.exists()  # it used to load the database, say "startup complete", exit 3


def test_bench_without_the_gpu_packages_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from measure import commands as measure_commands

    monkeypatch.setattr(measure_commands, "missing_gpu_packages", lambda: ["torch"])
    result = runner.invoke(
        app, ["bench", "--config", "fa2_d64_fp16_full_br64_bc64_w4_s1_swz", "--n", "128"]
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "needs torch" in result.stderr and "fa2tune[gpu]" in result.stderr
