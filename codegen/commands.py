"""CLI sub-commands of the codegen stage: ``fa2tune space`` and ``fa2tune build``."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from codegen.build import (
    BuildBatch,
    NvccNotFoundError,
    build_batch,
    report_to_dict,
)
from codegen.families import FAMILIES, Family, family_of
from codegen.render import TemplateMissingError
from codegen.targets import (
    ARCH_SMEM_LIMIT,
    SUPPORTED_ARCHS,
    compute_capability_of,
)
from core.build_report import BuildReport, BuildStatus
from core.config import DTYPES, HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.family import AnyConfig, config_from_name

logger = logging.getLogger(__name__)

_STATUS_STYLE: dict[BuildStatus, str] = {
    BuildStatus.OK: "green",
    BuildStatus.SPILLS: "yellow",
    BuildStatus.SMEM_OVERFLOW: "red",
    BuildStatus.COMPILE_FAILED: "red",
}


def _console() -> Console:
    console = Console()
    if not console.is_terminal:  # piped to a file: rich would assume 80 columns and squeeze
        console = Console(width=max(console.width, 160))
    return console


def _name_column(table: Table, configs: Sequence[AnyConfig]) -> None:
    # Names are what users copy into --config: never truncate them, squeeze the numbers instead.
    width = max((len(c.name) for c in configs), default=4)
    table.add_column("name", no_wrap=True, min_width=width)


#: The head dims of the families that do not take every one, for --d's help.
_FAMILY_DIMS = "; ".join(
    f"{f.name}: {f.head_dims_text}" for f in FAMILIES.values() if f.head_dims != HEAD_DIMS
)
_D_HELP = f"head dimension, {HEAD_DIMS_RULE}" + (f" ({_FAMILY_DIMS})" if _FAMILY_DIMS else "")
_FAMILY_NAMES = ", ".join(FAMILIES)


def _check_d(d: int, family: str = "fa2") -> int:
    if d not in HEAD_DIMS:
        raise typer.BadParameter(
            f"{d} is not a supported head dim; use {HEAD_DIMS_RULE}", param_hint="--d"
        )
    fam = FAMILIES.get(family)
    if fam is not None and d not in fam.head_dims:
        raise typer.BadParameter(
            f"the {family} family has no head dim {d}; use one of {fam.head_dims_text}",
            param_hint="--d",
        )
    return d


def _check_dtype(dtype: str) -> Dtype:
    if dtype not in DTYPES:
        raise typer.BadParameter(
            f"{dtype!r} is not a supported dtype; use one of {', '.join(DTYPES)}",
            param_hint="--dtype",
        )
    return dtype  # narrowed to Dtype by the membership check above


def _check_arch(arch: str) -> str:
    if arch not in SUPPORTED_ARCHS:
        raise typer.BadParameter(
            f"{arch!r} is not a supported architecture; use one of {', '.join(SUPPORTED_ARCHS)}",
            param_hint="--arch",
        )
    return arch


def _family_for(family: str, arch: str) -> Family:
    """The family named ``family``, refused where it has no code for ``arch`` GPUs."""
    fam = FAMILIES.get(family)
    if fam is None:
        raise typer.BadParameter(
            f"{family!r} is not a kernel family; use one of {', '.join(FAMILIES)}",
            param_hint="--family",
        )
    if fam.arch_for(compute_capability_of(arch)) is None:
        raise typer.BadParameter(
            f"the {family} family does not build for {arch} GPUs (its targets: "
            f"{', '.join(fam.archs)})",
            param_hint="--arch",
        )
    return fam


def _family_space(
    family: str, d: int, dtype: Dtype, causal: bool, smem: int, arch: str
) -> list[AnyConfig]:
    return _family_for(family, arch).space(d, dtype, causal, smem, arch)


def space(
    d: Annotated[int, typer.Option("--d", help=_D_HELP)],
    dtype: Annotated[str, typer.Option("--dtype", help="fp16 or bf16")] = "fp16",
    causal: Annotated[bool, typer.Option("--causal", help="causal mask")] = False,
    smem_limit: Annotated[
        int | None,
        typer.Option(
            "--smem-limit",
            help="dynamic shared memory per block in bytes (default and at most: --arch's)",
            min=1,
        ),
    ] = None,
    arch: Annotated[str, typer.Option("--arch", help="target architecture")] = "sm_90",
    family: Annotated[
        str,
        typer.Option("--family", help=f"kernel family: one of {_FAMILY_NAMES}"),
    ] = "fa2",
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """List the valid kernel configs of a family for one head dim, dtype and mask."""
    _check_arch(arch)
    limit = smem_limit if smem_limit is not None else ARCH_SMEM_LIMIT[arch]
    configs = _family_space(family, _check_d(d, family), _check_dtype(dtype), causal, limit, arch)
    if as_json:
        rows = [
            {
                "name": c.name,
                "family": c.family,
                **c.to_dict(),
                "tile": c.tile,
                "description": c.describe(),
                **family_of(c).columns(c),
                "smem_bytes": c.smem_bytes,
                "est_registers": family_of(c).est_registers(c),
            }
            for c in configs
        ]
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"{family} D={d} {dtype} {'causal' if causal else 'full'}: {len(configs)} configs",
    )
    _name_column(table, configs)
    table.add_column("config")
    table.add_column("smem bytes", justify="right")
    table.add_column("est. regs", justify="right")
    for c in configs:
        table.add_row(c.name, c.describe(), str(c.smem_bytes), str(family_of(c).est_registers(c)))
    _console().print(table)


def _named_configs(names: list[str], arch: str) -> list[AnyConfig]:
    configs: list[AnyConfig] = []
    for name in names:
        try:
            config = config_from_name(name)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--config") from None
        ok, reason = family_of(config).check(config, ARCH_SMEM_LIMIT[arch])
        if not ok:
            raise typer.BadParameter(
                f"{name} is not a valid config: {reason}", param_hint="--config"
            )
        configs.append(config)
    return configs


def _select_configs(
    d: int | None,
    dtype: str | None,
    causal: bool,
    arch: str,
    limit: int | None,
    names: list[str] | None,
    family: str = "fa2",
) -> list[AnyConfig]:
    configs: list[AnyConfig]
    if names:
        configs = _named_configs(names, arch)
        # --d/--dtype/--causal with --config would be ambiguous unless they agree.
        for c in configs:
            if d is not None and c.d != d:
                raise typer.BadParameter(f"{c.name} has D={c.d}, not {d}", param_hint="--d")
            if dtype is not None and c.dtype != dtype:
                raise typer.BadParameter(
                    f"{c.name} is {c.dtype}, not {dtype}", param_hint="--dtype"
                )
            if causal and not c.causal:
                raise typer.BadParameter(f"{c.name} is not causal", param_hint="--causal")
    elif d is None:
        configs = _family_defaults(family, _check_dtype(dtype or "fp16"), causal, arch)
    else:
        configs = _family_space(
            family,
            _check_d(d, family),
            _check_dtype(dtype or "fp16"),
            causal,
            ARCH_SMEM_LIMIT[arch],
            arch,
        )
    return configs[:limit] if limit is not None else configs


def _family_defaults(family: str, dtype: Dtype, causal: bool, arch: str) -> list[AnyConfig]:
    """The family's default config of every head dim it has, fitted to the target's shared
    memory: what a GPU of that target runs where nothing is tuned (``fa2tune build --arch X``
    alone)."""
    fam = _family_for(family, arch)
    # One per tile width first (the multiples of 32: D=40 runs D=64's tile), so that a short
    # --limit still covers every tile the family instantiates.
    dims = sorted(fam.head_dims, key=lambda d: (d % 32 != 0, d))
    fitted = (fam.default_within(d, dtype, causal, ARCH_SMEM_LIMIT[arch]) for d in dims)
    return [c for c in fitted if c is not None]


def _report_table(batch: BuildBatch, title: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=title)
    _name_column(table, [r.config for r in batch.reports])
    table.add_column("status")
    for column in ("regs", "spill st", "spill ld", "stack", "smem", "seconds"):
        table.add_column(column, justify="right")
    for r in batch.reports:
        table.add_row(*_report_row(r))
    return table


def _report_row(r: BuildReport) -> tuple[str, ...]:
    style = _STATUS_STYLE.get(r.status, "")
    status = f"[{style}]{r.status}[/{style}]" if style else str(r.status)
    smem = r.static_smem + r.config.smem_bytes
    return (
        r.config.name,
        status,
        "-" if r.registers is None else str(r.registers),
        str(r.spill_stores),
        str(r.spill_loads),
        str(r.stack_bytes),
        str(smem),
        f"{r.compile_seconds:.1f}",
    )


def _summary(batch: BuildBatch) -> str:
    rate = batch.configs_per_minute
    return (
        f"built {batch.built}, cached {batch.cached}, failed {batch.failed}, "
        f"spilling {batch.spilling}; "
        + (f"{rate:.1f} configs/minute" if rate is not None else "nothing compiled")
        + f" ({batch.seconds:.1f} s)"
    )


def build(
    d: Annotated[int | None, typer.Option("--d", help=_D_HELP)] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="fp16 (default) or bf16")] = None,
    causal: Annotated[bool, typer.Option("--causal", help="causal mask")] = False,
    arch: Annotated[str, typer.Option("--arch", help="target architecture")] = "sm_90",
    limit: Annotated[
        int | None, typer.Option("--limit", help="build only the first K configs", min=1)
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option("--config", help="build this config (by name); repeatable"),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", help="parallel nvcc jobs (env FA2TUNE_BUILD_JOBS)", min=1),
    ] = None,
    family: Annotated[
        str, typer.Option("--family", help=f"kernel family of --d's space: {_FAMILY_NAMES}")
    ] = "fa2",
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list of reports")] = False,
) -> None:
    """Compile a config space (``--d``), the named configs (``--config``) or, with neither, the
    family's default config of every head dim; ``--limit`` keeps the first K. Shows ptxas's
    report of each.

    Failed configs are reported, not fatal: the exit status is 0 unless the input is wrong
    or nvcc (or the kernel template) is missing.
    """
    _check_arch(arch)
    if dtype is not None:
        _check_dtype(dtype)
    configs = _select_configs(d, dtype, causal, arch, limit, config, family)
    try:
        batch = build_batch(configs, arch=arch, jobs=jobs)
    except (NvccNotFoundError, TemplateMissingError) as exc:
        typer.echo(f"fa2tune build: {exc}", err=True)
        raise typer.Exit(code=1) from None
    if as_json:
        typer.echo(json.dumps([report_to_dict(r) for r in batch.reports], indent=1))
        logger.info(_summary(batch))
        return
    console = _console()
    console.print(_report_table(batch, f"{len(configs)} configs for {arch}"))
    for r in batch.reports:
        if r.error and r.status in (BuildStatus.COMPILE_FAILED, BuildStatus.SMEM_OVERFLOW):
            first = r.error.splitlines()[0] if r.error else ""
            # soft_wrap: error lines hold paths; let the terminal wrap them, keep them greppable
            console.print(f"[red]{r.config.name}[/red]: {first}", highlight=False, soft_wrap=True)
    console.print(_summary(batch), soft_wrap=True)
