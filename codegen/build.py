"""Compiling configs to cubins: flags, a content-addressed cache, the batch build, reports.

Every config gets its own directory ``<cache_dir>/<arch>/<name>-<hash>/`` where ``hash`` covers
everything that determines the cubin: the template files, the instantiation text, the nvcc
flags, the nvcc version and the architecture. A directory whose result JSON exists is
finished (successfully or not: failures are deterministic, so they are cached too) and is never
rebuilt. The rest are compiled by one generated ``build.ninja`` per target
(:mod:`codegen.ninja`); each edge runs :mod:`codegen.nvcc_job`, which captures ptxas's ``-v``
report and always succeeds, so one broken config never stops the batch. Reports are then parsed
from the logs with :mod:`codegen.ptxas`.

Contract: :func:`build_batch` (and :func:`build_configs`) return one :class:`BuildReport` per
input config, in input order, whatever nvcc did; only bad input (an unknown architecture,
``jobs < 1``), a missing template or a missing nvcc raise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from codegen.compiler import CompilerNotFoundError, resolve_compiler
from codegen.families import family_of
from codegen.ninja import DEFAULT_TIMEOUT_S, NinjaEntry, compile_entries
from codegen.ptxas import classify_errors, error_excerpt, parse_ptxas
from codegen.render import template_dir as default_template_dir
from codegen.render import template_hash, write_if_changed
from codegen.targets import ARCH_SMEM_LIMIT, compute_capability_of
from core.build_report import BuildReport, BuildStatus
from core.family import AnyConfig
from core.settings import get_settings

logger = logging.getLogger(__name__)

#: nvcc flags of every build, before the architecture and include flags. ``-Xptxas -v`` makes
#: ptxas report registers, spills and smem; no fast-math: the template calls ex2.approx itself.
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-cubin", "-Xptxas", "-v", "-lineinfo")
HASH_CHARS = 16


#: Every target a family builds for, with its opt-in shared memory per block: the GPU
#: architectures (``codegen.families.fa2.space``) and the architecture-specific ``sm_90a``
#: of Hopper's wgmma/TMA family, which runs on exactly the GPUs ``sm_90`` names.
TARGET_SMEM_LIMIT: dict[str, int] = {**ARCH_SMEM_LIMIT, "sm_90a": ARCH_SMEM_LIMIT["sm_90"]}


class NvccNotFoundError(CompilerNotFoundError):
    """nvcc cannot be run (and, where the compiler is ``auto``, neither can NVRTC)."""


@dataclass(frozen=True)
class BuildBatch:
    """The outcome of :func:`build_batch`.

    Attributes:
        reports: one report per input config, in input order.
        built: configs compiled in this call.
        cached: configs served from the cache.
        failed: reports whose status is ``COMPILE_FAILED`` or ``SMEM_OVERFLOW``.
        spilling: reports whose status is ``SPILLS``.
        seconds: wall time of the ninja run (0 when everything was cached).
    """

    reports: list[BuildReport]
    built: int
    cached: int
    failed: int
    spilling: int
    seconds: float

    @property
    def configs_per_minute(self) -> float | None:
        """Compile throughput of this call; None when nothing was compiled."""
        if self.built == 0 or self.seconds <= 0:
            return None
        return self.built * 60.0 / self.seconds


# ---------------------------------------------------------------------------------------------
# Flags, toolchain and hashing


def arch_flags(arch: str) -> list[str]:
    """The ``-gencode`` flag for ``arch`` (``"sm_90"`` -> compute_90 PTX compiled to sm_90).

    Raises:
        ValueError: for a target outside :data:`TARGET_SMEM_LIMIT`.
    """
    if arch not in TARGET_SMEM_LIMIT:
        raise ValueError(
            f"unsupported architecture {arch!r}; expected one of {', '.join(TARGET_SMEM_LIMIT)}"
        )
    number = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{number},code=sm_{number}"]


def nvcc_flags(arch: str) -> list[str]:
    """The flags that shape the cubin: :data:`DEFAULT_FLAGS` plus :func:`arch_flags`.

    The ``-I`` of the template directory is added at build time and deliberately left out of
    these (and of the hash): the directory's location does not change the cubin, its content
    is hashed by :func:`codegen.render.template_hash`.
    """
    return [*DEFAULT_FLAGS, *arch_flags(arch)]


@lru_cache(maxsize=16)
def nvcc_version(nvcc: str) -> str:
    """nvcc's release line, e.g. ``"Cuda compilation tools, release 13.0, V13.0.88"``.

    Cached per executable name for the life of the process.

    Raises:
        NvccNotFoundError: when nvcc cannot be run or does not answer ``--version``.
    """
    try:
        proc = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NvccNotFoundError(
            f"cannot run nvcc ({nvcc!r}): {exc}. Install the CUDA toolkit and put nvcc on PATH, "
            "or point FA2TUNE_NVCC at it."
        ) from exc
    if proc.returncode != 0:
        raise NvccNotFoundError(
            f"{nvcc} --version exited with status {proc.returncode}: {proc.stderr.strip()}"
        )
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    for line in lines:
        if "release" in line:
            return line
    if not lines:
        raise NvccNotFoundError(f"{nvcc} --version printed nothing")
    return lines[-1]


def source_hash(
    template_digest: str,
    instantiation: str,
    flags: Sequence[str],
    nvcc_release: str,
    arch: str,
) -> str:
    """The build directory hash: sha256 over every input of the cubin, first 16 hex digits.

    Args:
        template_digest: :func:`codegen.render.template_hash`.
        instantiation: the rendered ``.cu`` text.
        flags: :func:`nvcc_flags`.
        nvcc_release: :func:`nvcc_version`.
        arch: target architecture.
    """
    payload = json.dumps(
        [template_digest, instantiation, list(flags), nvcc_release, arch], separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:HASH_CHARS]


def build_directory(cache_dir: Path, arch: str, config: AnyConfig, digest: str) -> Path:
    """``<cache_dir>/<arch>/<config.name>-<digest>``."""
    return cache_dir / arch / f"{config.name}-{digest}"


# ---------------------------------------------------------------------------------------------
# Reports


def read_result(path: Path) -> dict[str, object] | None:
    """A job's result JSON, or None when it is missing, unreadable or unfinished."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("finished") is not True:
        return None
    return data


def report_from_files(
    config: AnyConfig,
    arch: str,
    entry: NinjaEntry,
    digest: str,
    nvcc_release: str,
    flags: Sequence[str],
    smem_limit: int,
) -> BuildReport:
    """Turn one finished (or unfinished) build directory into a :class:`BuildReport`.

    Status, in order: ``COMPILE_FAILED`` when the job did not finish or nvcc failed (or
    ``SMEM_OVERFLOW`` when ptxas said "uses too much shared data"); ``SMEM_OVERFLOW`` when
    static plus dynamic shared memory exceed ``smem_limit``; ``SPILLS`` when ptxas reports spill
    bytes; else ``OK``.
    """
    result = read_result(entry.result)
    base: dict[str, object] = {
        "config": config,
        "arch": arch,
        "source_hash": digest,
        "nvcc_version": nvcc_release,
        "flags": tuple(flags),
    }

    def failed(status: BuildStatus, error: str, seconds: float = 0.0) -> BuildReport:
        return BuildReport(
            status=status,
            registers=None,
            spill_stores=0,
            spill_loads=0,
            stack_bytes=0,
            static_smem=0,
            compile_seconds=seconds,
            cubin=None,
            error=error,
            **base,  # type: ignore[arg-type]
        )

    if result is None:
        return failed(BuildStatus.COMPILE_FAILED, "the build job did not finish (see the log)")
    seconds = float(result.get("seconds", 0.0))  # type: ignore[arg-type]
    returncode = int(result.get("returncode", -1))  # type: ignore[call-overload]
    try:
        text = entry.log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    has_cubin = result.get("cubin") is not None and entry.cubin.is_file()

    if returncode != 0 or not has_cubin:
        problem = classify_errors(text, returncode if returncode != 0 else 1)
        if problem is None:  # unreachable: classify_errors always reports a failure here
            return failed(BuildStatus.COMPILE_FAILED, error_excerpt(text), seconds)
        return failed(problem.status, problem.excerpt, seconds)

    info = parse_ptxas(text, config.name, arch)
    if not info.found or info.registers is None:
        return failed(
            BuildStatus.COMPILE_FAILED,
            f"nvcc succeeded but ptxas printed no report for {config.name} (was -Xptxas -v "
            "dropped?)",
            seconds,
        )
    status = BuildStatus.SPILLS if info.spills else BuildStatus.OK
    error: str | None = None
    total_smem = info.static_smem + config.smem_bytes
    if total_smem > smem_limit:
        status = BuildStatus.SMEM_OVERFLOW
        error = (
            f"needs {total_smem} bytes of shared memory ({info.static_smem} static + "
            f"{config.smem_bytes} dynamic), over the {arch} limit of {smem_limit}"
        )
    return BuildReport(
        status=status,
        registers=info.registers,
        spill_stores=info.spill_stores,
        spill_loads=info.spill_loads,
        stack_bytes=info.stack_bytes,
        static_smem=info.static_smem,
        compile_seconds=seconds,
        cubin=entry.cubin,
        error=error,
        **base,  # type: ignore[arg-type]
    )


def report_to_dict(report: BuildReport) -> dict[str, object]:
    """A JSON-ready view of a report (the config's fields nested under ``config``)."""
    return {
        "name": report.config.name,
        "config": report.config.to_dict(),
        "arch": report.arch,
        "status": str(report.status),
        "registers": report.registers,
        "spill_stores": report.spill_stores,
        "spill_loads": report.spill_loads,
        "stack_bytes": report.stack_bytes,
        "static_smem": report.static_smem,
        "dynamic_smem": report.config.smem_bytes,
        "compile_seconds": report.compile_seconds,
        "cubin": str(report.cubin) if report.cubin is not None else None,
        "source_hash": report.source_hash,
        "nvcc_version": report.nvcc_version,
        "flags": list(report.flags),
        "error": report.error,
    }


# ---------------------------------------------------------------------------------------------
# The batch build


def build_batch(
    configs: Sequence[AnyConfig],
    arch: str = "sm_90",
    cache_dir: Path | None = None,
    jobs: int | None = None,
    *,
    nvcc: str | None = None,
    template_dir: Path | None = None,
    smem_limit: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> BuildBatch:
    """Compile ``configs`` for a GPU of ``arch`` (cached ones are not rebuilt), report on each.

    Each config is compiled for its family's target on that GPU (``sm_90a`` for the Hopper
    family on an ``sm_90`` GPU, ``arch`` itself for the portable one), with its family's
    instantiation and template hash; a config whose family has no target there is reported
    ``COMPILE_FAILED`` with the reason, without running nvcc.

    Args:
        configs: the configs, of any family; duplicates are built once and reported at each
            position.
        arch: the GPU's architecture, one of :data:`codegen.families.fa2.space.SUPPORTED_ARCHS`.
        cache_dir: the build cache; default ``settings.cache_dir``.
        jobs: parallel nvcc jobs; default ``settings.build_jobs``.
        nvcc: the nvcc executable; default ``settings.nvcc``.
        template_dir: where the family templates live; default the package's templates.
        smem_limit: shared memory per block for the ``SMEM_OVERFLOW`` check; default the
            architecture's opt-in maximum.
        timeout_s: seconds before one nvcc call is killed (reported as a failure).

    Returns:
        The reports in input order and the batch's counts.

    Raises:
        ValueError: for an unsupported architecture or ``jobs < 1``.
        TemplateMissingError: when a family's template (or a header it includes) is missing.
        NvccNotFoundError: when nvcc cannot be run.
    """
    nvcc_flags(arch)  # validates arch first: bad input is reported before any work
    settings = get_settings()
    cache_root = Path(cache_dir if cache_dir is not None else settings.cache_dir)
    n_jobs = jobs if jobs is not None else settings.build_jobs
    if n_jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {n_jobs}")
    nvcc_exe = nvcc if nvcc is not None else settings.nvcc
    # Absolute, because nvcc runs in each config's build directory.
    tdir = (template_dir if template_dir is not None else default_template_dir()).resolve()
    limit = smem_limit if smem_limit is not None else ARCH_SMEM_LIMIT[arch]
    try:
        compiler = resolve_compiler(nvcc_exe, settings.compiler, nvcc_version)
    except NvccNotFoundError:
        raise
    except CompilerNotFoundError as exc:  # the NVRTC setting: reported like a missing nvcc
        raise NvccNotFoundError(str(exc)) from exc
    release = compiler.release
    cc = compute_capability_of(arch)

    unique = list(dict.fromkeys(configs))
    plans: dict[AnyConfig, _Plan] = {}
    unbuildable: dict[AnyConfig, BuildReport] = {}
    pending: dict[str, list[NinjaEntry]] = {}
    digests_by_family: dict[str, str] = {}
    for config in unique:
        family = family_of(config)
        target = family.arch_for(cc)
        if target is None:
            unbuildable[config] = _no_target(config, arch, family.name, release)
            continue
        if family.name not in digests_by_family:
            digests_by_family[family.name] = template_hash(tdir, main=family.templates[0])
        flags = compiler.flags(target, nvcc_flags(target))
        text = family.render(config)
        digest = source_hash(digests_by_family[family.name], text, flags, release, target)
        entry = NinjaEntry.in_directory(
            config.name, build_directory(cache_root, target, config, digest)
        )
        plans[config] = _Plan(target, tuple(flags), digest, entry)
        if read_result(entry.result) is not None:
            continue
        # A stale result (unfinished or unreadable) must not look like an up-to-date output.
        entry.result.unlink(missing_ok=True)
        write_if_changed(entry.source, text)
        pending.setdefault(target, []).append(entry)

    to_build = sum(len(v) for v in pending.values())
    cached = len(plans) - to_build
    logger.info(
        "building %d configs for %s: %d cached, %d to compile with %d jobs%s",
        len(unique),
        arch,
        cached,
        to_build,
        n_jobs,
        f" ({compiler.release})" if compiler.kind != "nvcc" else "",
    )
    seconds = 0.0
    for target, entries in pending.items():
        flags = compiler.command_flags(target, nvcc_flags(target), tdir)
        seconds += compile_entries(
            entries, compiler.executable, flags, cache_root / target, n_jobs, timeout_s
        )

    by_config = dict(unbuildable)
    for c, plan in plans.items():
        by_config[c] = report_from_files(
            c,
            plan.target,
            plan.entry,
            plan.digest,
            release,
            plan.flags,
            min(limit, TARGET_SMEM_LIMIT[plan.target]),
        )
    reports = [by_config[c] for c in configs]
    unique_reports = list(by_config.values())
    failed = sum(
        r.status in (BuildStatus.COMPILE_FAILED, BuildStatus.SMEM_OVERFLOW) for r in unique_reports
    )
    spilling = sum(r.status == BuildStatus.SPILLS for r in unique_reports)
    batch = BuildBatch(reports, to_build, cached, failed, spilling, seconds)
    rate = batch.configs_per_minute
    logger.info(
        "built %d, cached %d, failed %d, spilling %d in %.1f s%s",
        batch.built,
        batch.cached,
        batch.failed,
        batch.spilling,
        seconds,
        f" ({rate:.1f} configs/min)" if rate is not None else "",
    )
    return batch


@dataclass(frozen=True)
class _Plan:
    """Where and how one config is built: its target, flags, source hash and directory."""

    target: str
    flags: tuple[str, ...]
    digest: str
    entry: NinjaEntry


def _no_target(config: AnyConfig, arch: str, family: str, release: str) -> BuildReport:
    return BuildReport(
        config=config,
        arch=arch,
        status=BuildStatus.COMPILE_FAILED,
        registers=None,
        spill_stores=0,
        spill_loads=0,
        stack_bytes=0,
        static_smem=0,
        compile_seconds=0.0,
        cubin=None,
        source_hash="",
        nvcc_version=release,
        flags=(),
        error=f"the {family} family does not build for {arch} GPUs",
    )


def build_configs(
    configs: Sequence[AnyConfig],
    arch: str = "sm_90",
    cache_dir: Path | None = None,
    jobs: int | None = None,
    *,
    nvcc: str | None = None,
    template_dir: Path | None = None,
    smem_limit: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[BuildReport]:
    """Compile ``configs`` and return one report per config, in input order.

    See :func:`build_batch` for the arguments and errors; this returns only its reports.
    """
    return build_batch(
        configs,
        arch,
        cache_dir,
        jobs,
        nvcc=nvcc,
        template_dir=template_dir,
        smem_limit=smem_limit,
        timeout_s=timeout_s,
    ).reports
