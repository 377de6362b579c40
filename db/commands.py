"""CLI sub-commands of the db stage: ``best``, ``dump`` and ``ingest``.

They open the database named by the settings (``FA2TUNE_DB_URL`` or the global ``--db``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from codegen.families import FAMILIES
from core.config import DTYPES, HEAD_DIMS, HEAD_DIMS_RULE
from core.kv_lengths import KV_LENGTHS, describe_kv_lengths, kv_lengths_error
from core.problem import KV_PAGE_RULE, describe_kv_page
from core.settings import get_settings
from core.shape import PHASE_RULE, Shape, phase_of
from core.shape_request import (
    DEFAULT_BATCH,
    DEFAULT_HEADS,
    ShapeParamError,
    VarlenRequest,
    no_variant_results,
    no_varlen_results,
    parse_window,
    resolve_kv_page,
    resolve_shape,
    resolve_variant,
    resolve_varlen,
)
from core.variant import PLAIN, Variant
from db.dump_format import TransferError
from db.results import BestResult
from db.shipped import load_shipped_results
from db.store import Store
from db.transfer import dump as dump_results
from db.transfer import export, ingest_file, to_json

logger = logging.getLogger(__name__)

MAX_N = 2**31 - 1  # the kernel's sequence lengths, batch and heads are int32 (FaParams)
#: Lengths a table row lists before it shortens the list (the JSON output has them all).
SHOWN_SEQLENS = 24
# Every family's head dims (each a subset of core.config.HEAD_DIMS).
SUPPORTED_HEAD_DIMS: tuple[int, ...] = tuple(
    sorted({*HEAD_DIMS, *(d for f in FAMILIES.values() for d in f.head_dims)})
)
#: The families that take only some head dims, for the message of a wrong --d.
_FAMILY_DIMS = "; ".join(
    f"{f.name}: {f.head_dims_text}" for f in FAMILIES.values() if f.head_dims != HEAD_DIMS
)


def _check_d(d: int) -> int:
    if d not in SUPPORTED_HEAD_DIMS:
        raise typer.BadParameter(
            f"{d} is not a supported head dim; use {HEAD_DIMS_RULE} ({_FAMILY_DIMS})",
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


def _measured_shape(result: BestResult) -> Shape:
    return Shape(result.n, result.nk, result.batch, result.heads, result.kv_heads)


def _config_rows(result: BestResult) -> list[tuple[str, str]]:
    config = result.config
    return [("config", config.name), ("family", config.family), ("tile", config.describe())]


def _measurement_rows(result: BestResult) -> list[tuple[str, str]]:
    """The rows every ``best`` table ends with: timing, build and device."""
    return [
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


def _table(result: BestResult, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=f"best on {result.gpu}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field, value in rows:
        table.add_row(field, value)
    return table


def _best_table(result: BestResult, asked: Shape | None = None, variant: Variant = PLAIN) -> Table:
    mask = "causal" if result.causal else "full"
    if asked is None:
        where = (
            f"N={result.n}"
            if result.exact
            else f"N={result.from_n} (nearest tuned N; exact N not tuned)"
        )
    elif result.exact:
        where = f"{_measured_shape(result).describe()} (the shape asked)"
    else:
        where = (
            f"{_measured_shape(result).describe()} (nearest tuned shape, distance "
            f"{result.distance:.3f}; asked {asked.describe()})"
        )
    problem = (
        f"D={result.d} {result.dtype} {mask}, batch {result.batch} x "
        f"{result.heads} heads ({result.kv_heads} kv), Nk={result.nk}"
    )
    rows = [*_config_rows(result), ("problem", problem), ("measured at", where)]
    if not variant.plain:
        rows.append(("variant", f"{result.variant.describe()} (asked {variant.describe()})"))
    if result.kv_page is not None:
        rows.append(("KV cache", f"timed over {describe_kv_page(result.kv_page)}"))
    if result.kv_lengths != "full":
        rows.append(("KV lengths", f"timed with {describe_kv_lengths(result.kv_lengths)}"))
    return _table(result, [*rows, *_measurement_rows(result)])


def _lengths(seqlens: tuple[int, ...]) -> str:
    """A length list for a table cell: the first :data:`SHOWN_SEQLENS`, then a count."""
    shown = ",".join(map(str, seqlens[:SHOWN_SEQLENS]))
    more = len(seqlens) - SHOWN_SEQLENS
    return shown if more <= 0 else f"{shown},... ({more} more)"


def _packed(seqlens: tuple[int, ...]) -> str:
    return f"{len(seqlens)} sequences, {sum(seqlens)} tokens, longest {max(seqlens)}"


def _varlen_table(result: BestResult, asked: VarlenRequest, measured: tuple[int, ...]) -> Table:
    mask = "causal" if result.causal else "full"
    if result.exact:
        where = "the lengths asked"
    else:
        where = (
            f"{_lengths(measured)} (nearest tuned varlen batch, distance "
            f"{result.distance:.3f}: {_packed(measured)})"
        )
    problem = (
        f"D={result.d} {result.dtype} {mask}, packed varlen batch, "
        f"{result.heads} heads ({result.kv_heads} kv)"
    )
    lengths = (
        f"{_lengths(asked.seqlens)} ({_packed(asked.seqlens)}; "
        f"{asked.heads} heads, {asked.kv_heads} kv)"
    )
    rows = [
        *_config_rows(result),
        ("problem", problem),
        ("lengths", lengths),
        ("measured at", where),
    ]
    if not result.variant.plain:
        rows.append(("variant", result.variant.describe()))
    return _table(result, [*rows, *_measurement_rows(result)])


@dataclasses.dataclass(frozen=True)
class VariantArgs:
    """The attention-variant options of ``best`` as given (``--window`` or its two halves,
    ``--chunk``, ``--softcap``, ``--sinks``), checked against each other."""

    window_left: int = -1
    window_right: int = -1
    chunk: int = 0
    softcap: float = 0.0
    sinks: bool = False

    @classmethod
    def of(
        cls,
        window: str | None,
        window_left: int | None,
        window_right: int | None,
        chunk: int,
        softcap: float,
        sinks: bool,
    ) -> VariantArgs:
        """Raises: typer.BadParameter: ``--window`` with one of its halves, or not L,R."""
        if window is not None:
            if window_left is not None or window_right is not None:
                raise typer.BadParameter(
                    "give --window LEFT,RIGHT or --window-left/--window-right, not both",
                    param_hint="--window",
                )
            try:
                window_left, window_right = parse_window(window)
            except ShapeParamError as exc:
                raise typer.BadParameter(str(exc), param_hint="--window") from None
        return cls(
            -1 if window_left is None else window_left,
            -1 if window_right is None else window_right,
            chunk, softcap, sinks,
        )  # fmt: skip

    def resolve(self, causal: bool, nq: int | None, nk: int | None) -> tuple[bool, Variant]:
        """:func:`core.shape_request.resolve_variant` of these options for the call's lengths.

        Raises:
            ShapeParamError: a value out of its domain (``param`` names it).
        """
        return resolve_variant(
            causal, window_left=self.window_left, window_right=self.window_right,
            chunk=self.chunk, softcap=self.softcap, sinks=self.sinks, nq=nq, nk=nk,
        )  # fmt: skip


def best(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name, e.g. H200 or 'NVIDIA H200'")],
    d: Annotated[
        int,
        typer.Option(
            "--d",
            help=f"head dimension, {HEAD_DIMS_RULE}",
            callback=_check_d,
        ),
    ],
    n: Annotated[
        int | None,
        typer.Option(
            "--n",
            help="sequence length (queries = keys); with a shape option, the query length",
            min=1,
            max=MAX_N,
        ),
    ] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="fp16 or bf16")] = "fp16",
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="causal mask")] = False,
    nq: Annotated[
        int | None,
        typer.Option("--nq", help="query length of the shape (default: --n)", min=1, max=MAX_N),
    ] = None,
    nk: Annotated[
        int | None,
        typer.Option(
            "--nk", help="key length of the shape (default: the query length)", min=1, max=MAX_N
        ),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(
            "--batch", help=f"batch size of the shape (default: {DEFAULT_BATCH})", min=1, max=MAX_N
        ),
    ] = None,
    heads: Annotated[
        int | None,
        typer.Option(
            "--heads", help=f"query heads of the shape (default: {DEFAULT_HEADS})", min=1, max=MAX_N
        ),
    ] = None,
    kv_heads: Annotated[
        int | None,
        typer.Option(
            "--kv-heads",
            help="key/value heads of the shape, a divisor of --heads (default: --heads)",
            min=1,
            max=MAX_N,
        ),
    ] = None,
    seqlens: Annotated[
        str | None,
        typer.Option(
            "--seqlens",
            help="a packed variable-length batch: each sequence's length, comma-separated "
            "(e.g. 100,4000,1822); not with --n, --nq, --nk or --batch",
        ),
    ] = None,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact", help="no fallback to the nearest tuned N (or shape, or varlen batch)"
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    window: Annotated[
        str | None,
        typer.Option(
            "--window",
            help="local attention window LEFT,RIGHT (FlashAttention's window_size; -1: no "
            "bound), e.g. 4096,0; or --window-left/--window-right",
        ),
    ] = None,
    window_left: Annotated[
        int | None, typer.Option("--window-left", help="the window's left bound")
    ] = None,
    window_right: Annotated[
        int | None, typer.Option("--window-right", help="the window's right bound")
    ] = None,
    chunk: Annotated[int, typer.Option("--chunk", help="chunked attention's chunk (0: none)")] = 0,
    softcap: Annotated[float, typer.Option("--softcap", help="logit softcap (0: none)")] = 0.0,
    sinks: Annotated[bool, typer.Option("--sinks", help="attention sinks")] = False,
    kv_page: Annotated[
        int | None,
        typer.Option(
            "--kv-page",
            help=f"a call over a KV cache with lengths on the device: {KV_PAGE_RULE}; "
            "answered by problems tuned on cache kernels of that layout only "
            "(fa2tune tune --kv-page)",
            show_default="a dense call",
        ),
    ] = None,
    kv_lengths: Annotated[
        str | None,
        typer.Option(
            "--kv-lengths",
            metavar=f"[{'|'.join(KV_LENGTHS)}]",
            help="with --kv-page, the length pattern the cache problems were timed on: full "
            f"({describe_kv_lengths('full')}) or mixed ({describe_kv_lengths('mixed')}, as a "
            "serving batch); answered by problems of that pattern only",
            show_default="either: the nearest, a tie going to mixed (what the op runs)",
        ),
    ] = None,
) -> None:
    """Show the fastest correct config measured for a GPU and problem.

    With --n alone: measured at N (queries = keys), else at the nearest tuned N. With any of
    --nq, --nk, --batch, --heads, --kv-heads: for that whole shape, measured at it, else at
    the nearest tuned shape (the distance of /v1/best). With --seqlens (and optionally
    --heads, --kv-heads): the fastest varlen config measured on those lengths, else on the
    nearest tuned varlen batch (as /v1/best/varlen answers).

    With --window, --chunk, --softcap or --sinks: the attention variant (FlashAttention's
    semantics), answered only by configs tuned with its switches, at the same window and
    chunk else the nearest tuned ones (not exact then), as /v1/best answers it.

    With --kv-page: a call over a KV cache of that layout (0 contiguous, P paged), answered
    for a whole shape by the problems tuned on the split-KV cache kernels of that very layout
    only (exact else the nearest of the call's phase), as /v1/best?kv_page= answers it.
    Without --kv-lengths the problems of both length patterns answer as the op runs a cache
    call (its lengths are on the device): the nearest, a tie going to those tuned on a length
    mix; with --kv-lengths full or mixed, only that pattern's.
    """
    if dtype not in DTYPES:
        raise typer.BadParameter(f"must be one of {', '.join(DTYPES)}", param_hint="--dtype")
    asked_variant = VariantArgs.of(window, window_left, window_right, chunk, softcap, sinks)
    try:
        kv_page = resolve_kv_page(kv_page)
    except ShapeParamError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kv-page") from None
    _check_kv_lengths(kv_lengths, kv_page)
    if seqlens is not None and kv_page is not None:
        raise typer.BadParameter(
            "a KV-cache call is a dense batch (its lengths live on the device); not with --seqlens",
            param_hint="--kv-page",
        )
    if seqlens is not None:
        dense = {"--n": n, "--nq": nq, "--nk": nk, "--batch": batch}
        given = [name for name, value in dense.items() if value is not None]
        if given:
            raise typer.BadParameter(
                f"cannot be combined with {', '.join(given)} (the lengths give the batch and "
                "each sequence's length)",
                param_hint="--seqlens",
            )
        try:
            request = resolve_varlen(seqlens, heads, kv_heads)
            longest = max(request.seqlens)
            causal, variant = asked_variant.resolve(causal, longest, longest)
        except ShapeParamError as exc:
            hint = f"--{exc.param.replace('_', '-')}"
            raise typer.BadParameter(str(exc), param_hint=hint) from None
        _best_varlen(gpu, d, dtype, causal, request, exact=exact, as_json=as_json,
                     variant=variant)  # fmt: skip
        return
    try:
        shape = resolve_shape(n, nq=nq, nk=nk, batch=batch, heads=heads, kv_heads=kv_heads)
        q = shape.nq if shape is not None else n
        causal, variant = asked_variant.resolve(causal, q, shape.nk if shape is not None else q)
        if (not variant.plain or kv_page is not None) and shape is None:
            shape = resolve_shape(n, nq=n)  # a variant or cache call: for a whole shape
    except ShapeParamError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"--{exc.param.replace('_', '-')}") from None
    with _open_store() as store:
        try:
            load_shipped_results(store)
        except TransferError as exc:  # a broken package must not hide the user's own results
            logger.error("shipped results not loaded: %s", exc)
        if shape is None:
            assert n is not None  # resolve_shape requires --n or --nq
            lookup = store.best if exact else store.best_or_nearest
            result = lookup(gpu, d, n, dtype, causal)
        elif kv_page is not None:
            result = store.best_for_cache_call(gpu, d, dtype, causal, shape, kv_page=kv_page,
                                               kv_lengths=kv_lengths, exact=exact,
                                               variant=variant)  # fmt: skip
        else:
            result = store.best_for_shape(gpu, d, dtype, causal, shape, exact=exact,
                                          variant=variant)  # fmt: skip
    if result is None:
        mask = "causal" if causal else "non-causal"
        if shape is None:
            what, fallback = f"N={n}", " at any N"
        else:
            # Lookups stay within the call's phase (core.shape.same_phase): say which.
            what, fallback = shape.describe(), f" at any {phase_of(shape)} shape ({PHASE_RULE})"
        if not variant.plain:
            fallback = "" if exact else " at any shape or window of its phase"
            what = f"{what} with {variant.describe()}"
        if kv_page is not None:
            what = f"{what} over {describe_kv_page(kv_page)}"
        if kv_lengths is not None:
            what = f"{what} with {describe_kv_lengths(kv_lengths)}"
        typer.echo(
            f"no successful measurement for {gpu} D={d} {what} {dtype} {mask}"
            f"{'' if exact else fallback}; tune it first (fa2tune tune) "
            "or ingest results (fa2tune ingest)",
            err=True,
        )
        raise typer.Exit(code=1)
    if as_json:
        data = result.to_dict()
        if shape is not None:
            data["shape"] = dataclasses.asdict(shape)
        if not variant.plain:
            data["asked_variant"] = dataclasses.asdict(variant)
        if kv_page is not None:
            data["asked_kv_page"] = kv_page
        if kv_lengths is not None:
            data["asked_kv_lengths"] = kv_lengths
        typer.echo(json.dumps(data, indent=2))
    else:
        Console().print(_best_table(result, shape, variant))


def _check_kv_lengths(kv_lengths: str | None, kv_page: int | None) -> None:
    """Raises: typer.BadParameter: ``--kv-lengths`` not a pattern, or given without
    ``--kv-page`` (only a KV-cache call has a length pattern)."""
    if kv_lengths is None:
        return
    why = kv_lengths_error(kv_lengths)
    if why is not None:
        raise typer.BadParameter(why, param_hint="--kv-lengths")
    if kv_page is None:
        raise typer.BadParameter(
            f"{kv_lengths} is the length pattern of a KV-cache call: give --kv-page too "
            "(0 for a contiguous cache)",
            param_hint="--kv-lengths",
        )


def _best_varlen(
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    asked: VarlenRequest,
    *,
    exact: bool,
    as_json: bool,
    variant: Variant = PLAIN,
) -> None:
    """``best --seqlens``: the answer of ``/v1/best/varlen`` from the local database."""
    with _open_store() as store:
        try:
            load_shipped_results(store)
        except TransferError as exc:  # a broken package must not hide the user's own results
            logger.error("shipped results not loaded: %s", exc)
        found = store.best_varlen(gpu, d, dtype, causal, asked.seqlens, asked.heads,
                                  asked.kv_heads, variant=variant)  # fmt: skip
    if found is None or (exact and not found[0].exact):
        mask = "causal" if causal else "full"
        none = (no_varlen_results(gpu, d, dtype, causal) if variant.plain
                else "varlen: " + no_variant_results(gpu, d, dtype, causal, variant))  # fmt: skip
        why = (
            none
            if found is None
            else f"no varlen result for {gpu!r}, D={d}, {dtype}, {mask} on exactly these "
            "lengths and heads"
        )
        typer.echo(
            f"{why}; tune it first (fa2tune tune --workload with seqlens entries) "
            "or ingest results (fa2tune ingest)",
            err=True,
        )
        raise typer.Exit(code=1)
    result, measured = found
    if as_json:
        data = result.to_dict()
        data["seqlens"] = list(asked.seqlens)
        data["measured_seqlens"] = list(measured)
        typer.echo(json.dumps(data, indent=2))
    else:
        Console().print(_varlen_table(result, asked, measured))


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
