"""The GPU architectures the product builds for, with the facts of each that a space or a build
reads, and the rule that maps a GPU's compute capability to one of them.

The facts come from the CUDA C++ Programming Guide's compute-capability tables (section 5.1,
"Technical Specifications per Compute Capability"; docs/build.md cites them). They serve
compiling ahead of time, where no GPU is present; at tune time the campaign reads the same
limits from the device itself (:func:`measure.gpuinfo.current_gpu_info`) and those win.

The portable families compile for these plain targets; an architecture-specific one such as
Hopper's ``sm_90a`` is added by the build (:data:`codegen.build.TARGET_SMEM_LIMIT`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache

log = logging.getLogger(__name__)

KIB = 1024


@dataclass(frozen=True)
class TargetFacts:
    """What one compute capability offers a kernel (per block and per SM).

    Attributes:
        arch: the nvcc target, ``"sm_120"``.
        gpus: examples of GPUs of this compute capability (for docs and messages).
        smem_per_block: dynamic shared memory one block may opt into, bytes.
        smem_per_sm: shared memory of one SM, bytes (what resident blocks share).
        threads_per_sm: resident threads per SM.
        blocks_per_sm: resident blocks per SM.
        registers_per_sm: 32-bit registers per SM (64 K on every target here).
    """

    arch: str
    gpus: str
    smem_per_block: int
    smem_per_sm: int
    threads_per_sm: int
    blocks_per_sm: int
    registers_per_sm: int = 64 * KIB

    @property
    def compute_capability(self) -> str:
        """``"12.0"`` for ``sm_120``."""
        return compute_capability_of(self.arch)


def _facts(*rows: TargetFacts) -> dict[str, TargetFacts]:
    return {row.arch: row for row in rows}


#: Every plain target, oldest first. The opt-in limit per block is the SM's shared memory
#: less the 1 KB the driver reserves for each block.
TARGETS: dict[str, TargetFacts] = _facts(
    TargetFacts("sm_80", "A100, A30", 163 * KIB, 164 * KIB, 2048, 32),
    TargetFacts("sm_86", "RTX 30-series, A10, A40, RTX A6000", 99 * KIB, 100 * KIB, 1536, 16),
    TargetFacts("sm_87", "Jetson AGX Orin", 163 * KIB, 164 * KIB, 1536, 16),
    TargetFacts("sm_89", "L4, L40S, RTX 40-series", 99 * KIB, 100 * KIB, 1536, 24),
    TargetFacts("sm_90", "H100, H200, GH200", 227 * KIB, 228 * KIB, 2048, 32),
    TargetFacts("sm_100", "B200, GB200", 227 * KIB, 228 * KIB, 2048, 32),
    TargetFacts("sm_103", "B300, GB300", 227 * KIB, 228 * KIB, 2048, 32),
    TargetFacts("sm_110", "Jetson Thor", 227 * KIB, 228 * KIB, 2048, 32),
    TargetFacts("sm_120", "RTX 50-series, RTX PRO 6000 Blackwell", 99 * KIB, 100 * KIB, 1536, 32),
    TargetFacts("sm_121", "DGX Spark (GB10)", 99 * KIB, 100 * KIB, 1536, 32),
)

#: Max dynamic shared memory per block after opt-in, per architecture.
ARCH_SMEM_LIMIT: dict[str, int] = {arch: t.smem_per_block for arch, t in TARGETS.items()}
SUPPORTED_ARCHS: tuple[str, ...] = tuple(TARGETS)
DEFAULT_SMEM_LIMIT = ARCH_SMEM_LIMIT["sm_90"]


def compute_capability_of(arch: str) -> str:
    """``"sm_90"`` -> ``"9.0"``, ``"sm_121"`` -> ``"12.1"``, ``"sm_90a"`` -> ``"9.0"``."""
    digits = arch.removeprefix("sm_").rstrip("a")
    return f"{digits[:-1]}.{digits[-1]}"


def parse_compute_capability(compute_capability: str) -> tuple[int, int]:
    """``"12.0"`` -> ``(12, 0)``.

    Raises:
        ValueError: not ``<major>.<minor>`` of integers.
    """
    try:
        major, minor = (int(x) for x in compute_capability.strip().split("."))
    except ValueError:
        raise ValueError(
            f"compute capability {compute_capability!r} is not <major>.<minor>, e.g. 9.0"
        ) from None
    return major, minor


def runs_on(arch: str, compute_capability: str) -> bool:
    """Whether a cubin built for ``arch`` runs on a GPU of ``compute_capability``.

    Builds are machine code only (never PTX for the driver to compile): a plain target runs on
    GPUs of its major version and an equal or newer minor one (``sm_86`` code on an 8.9 GPU),
    an architecture-specific one (``sm_90a``) on exactly its compute capability.
    """
    t_major, t_minor = parse_compute_capability(compute_capability_of(arch))
    major, minor = parse_compute_capability(compute_capability)
    if arch.endswith("a"):
        return (t_major, t_minor) == (major, minor)
    return t_major == major and t_minor <= minor


def target_for(compute_capability: str) -> str | None:
    """The plain target to build for a GPU of ``compute_capability``: its own, else the newest
    lower one its driver runs (same major version; logged once per compute capability), else
    None: fa2tune has no machine code that GPU can run (a new major version).

    Raises:
        ValueError: ``compute_capability`` is not ``<major>.<minor>``.
    """
    parse_compute_capability(compute_capability)
    return _target_for(compute_capability.strip())


@cache
def _target_for(compute_capability: str) -> str | None:
    fitting = [a for a in SUPPORTED_ARCHS if runs_on(a, compute_capability)]
    if not fitting:
        return None
    arch = fitting[-1]  # TARGETS is oldest first
    if TARGETS[arch].compute_capability != compute_capability:
        log.warning(
            "fa2tune has no %s target; a GPU of compute capability %s runs its %s code "
            "(limits of %s until the device's own are read)",
            f"sm_{compute_capability.replace('.', '')}", compute_capability, arch, arch,
        )  # fmt: skip
    return arch


def facts_for(compute_capability: str) -> TargetFacts | None:
    """The facts of :func:`target_for`'s target; None where there is none."""
    arch = target_for(compute_capability)
    return TARGETS[arch] if arch is not None else None


def check_arch(arch: str) -> str:
    """``arch`` when it is a plain target, else a ValueError that lists the targets.

    Raises:
        ValueError: ``arch`` is not one of :data:`SUPPORTED_ARCHS`.
    """
    if arch not in TARGETS:
        raise ValueError(
            f"unsupported architecture {arch!r}; expected one of {', '.join(SUPPORTED_ARCHS)}"
        )
    return arch
