"""CLI sub-commands of the service stage: ``serve`` (the HTTP API) and ``export`` (the header)."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from codegen.dispatch_kvcache import KV_PAGES_RULE, parse_kv_pages
from codegen.export import ExportError
from core.config import COMMON_HEAD_DIMS, DTYPES, HEAD_DIMS_RULE, Dtype
from core.settings import get_settings, override_settings
from db.dump_format import TransferError
from db.shipped import load_shipped_results
from db.store import Store
from service.header import UnknownGpuError, export_header

log = logging.getLogger(__name__)


def _cannot_write(path: Path, exc: OSError) -> OSError:
    """The error for a file that cannot be written, worded for the CLI's one line."""
    why = exc.strerror or str(exc)
    if isinstance(exc, FileExistsError) and exc.filename and not Path(exc.filename).is_dir():
        why = f"{exc.filename} is not a directory"  # mkdir(exist_ok=True) on a file
    return OSError(f"cannot write {path}: {why}")


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` once the way the server will (``SO_REUSEADDR``), then let it go.

    Raises:
        OSError: the address cannot be bound (in use, not this machine's, no permission),
            worded for the CLI's one error line.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise OSError(f"cannot listen on {host}:{port}: {why}") from None


def serve(
    host: Annotated[
        str | None, typer.Option("--host", help="bind address (env FA2TUNE_HOST; 127.0.0.1)")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535, help="port (env FA2TUNE_PORT; 8000)"),
    ] = None,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="log every request")
    ] = True,
) -> None:
    """Serve the HTTP API (/v1/best, /v1/results, /v1/export/header; docs at /docs).

    Its limits (connections, idle and header timeouts, header size, the slow endpoints'
    queues, ingest size and time) are FA2TUNE_SERVICE_* and FA2TUNE_INGEST_* settings; see
    docs/service.md.
    """
    import uvicorn  # the other sub-commands do not need the server

    from service.connections import uvicorn_options
    from service.main import create_app

    override_settings(host=host, port=port)
    settings = get_settings()
    # Before the database is opened and migrated: a busy port is the user's to fix first, not
    # an exit (status 3) after "startup complete".
    check_port_free(settings.host, settings.port)
    app = create_app()
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host
    log.info("fa2tune service on http://%s:%d (API docs: /docs)", shown, settings.port)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=access_log,
        # The CLI already configured logging; keep uvicorn from replacing it.
        log_config=None,
        # Connections: a cap, idle ones closed, bounded request heads (service.connections).
        **uvicorn_options(settings),
    )


def _parse_ds(value: str | None) -> list[int] | None:
    if value is None:
        return None
    # The HTTP export's rule; imported here, since service.params loads fastapi (slow to import).
    from service.params import parse_head_dims

    try:
        ds = parse_head_dims([value])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--d") from None
    if ds is None:
        raise typer.BadParameter("no head dim given", param_hint="--d")
    return ds


def _parse_dtypes(value: str | None) -> list[Dtype] | None:
    if value is None:
        return None
    dtypes: list[Dtype] = []
    for item in value.split(","):
        item = item.strip()
        if item not in DTYPES:
            raise typer.BadParameter(
                f"{item!r} is not one of {','.join(DTYPES)}", param_hint="--dtype"
            )
        dtypes.append(item)
    return dtypes


def _parse_kv_pages(value: str | None) -> tuple[int, ...]:
    if value is None:
        return ()
    try:
        return parse_kv_pages([value])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kv-pages") from None


def export(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name, e.g. 'NVIDIA H200' or H200")],
    d: Annotated[
        str | None,
        typer.Option(
            "--d",
            help=f"head dims, comma-separated, each {HEAD_DIMS_RULE} (default: "
            f"{', '.join(map(str, COMMON_HEAD_DIMS))} and every head dim tuned for the GPU)",
        ),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="fp16, bf16 or fp16,bf16 (default: both)")
    ] = None,
    output: Annotated[
        Path,
        typer.Option("--output", "-o", dir_okay=False, help="header to write; '-' for stdout"),
    ] = Path("fa2_tuned.cuh"),
    kv_pages: Annotated[
        str | None,
        typer.Option(
            "--kv-pages",
            help="page sizes of KV-cache kernels (fa2tune_forward_kvcache), comma-separated, "
            f"each {KV_PAGES_RULE}, e.g. 0,16 (default: none)",
        ),
    ] = None,
) -> None:
    """Write one self-contained CUDA header with the configs tuned for a GPU.

    The header inlines the kernel template, instantiates the tuned configs and FA2's
    defaults, and defines fa2tune_forward(params, head_dim, dtype, causal, stream); with the
    attention variants tuned for the GPU (windows, chunks, softcap, sinks),
    fa2tune_forward_variant(params, variant, head_dim, dtype, causal, stream) runs their
    winners (other variants are refused); with --kv-pages, fa2tune_forward_kvcache(...) runs
    attention over KV caches of those page sizes (0: contiguous), appending new rows in place.
    It compiles with plain nvcc; no Python is needed to use it.
    """
    ds = _parse_ds(d)
    dtypes = _parse_dtypes(dtype)
    pages = _parse_kv_pages(kv_pages)
    to_stdout = str(output) == "-"
    with Store.from_url(get_settings().db_url) as store:
        try:
            load_shipped_results(store)
        except TransferError as exc:  # a broken package must not hide the user's own results
            log.error("shipped results not loaded: %s", exc)
        try:
            text = export_header(
                store,
                gpu,
                ds,
                dtypes=dtypes,
                filename="fa2_tuned.cuh" if to_stdout else output.name,
                kv_pages=pages,
            )
        except UnknownGpuError as exc:
            log.error("%s; tune it first (fa2tune tune) or ingest results (fa2tune ingest)", exc)
            raise typer.Exit(code=1) from None
        except ExportError as exc:
            log.error("%s", exc)
            raise typer.Exit(code=1) from None
    if to_stdout:
        sys.stdout.write(text)
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:  # the CLI prints it as one line (fa2tune.cli)
        raise _cannot_write(output, exc) from exc
    log.info("wrote %s (%d lines)", output, text.count("\n"))
