"""The GPU architectures the product builds for, and the shared memory a block may opt into.

Hardware facts every family's space and the build read (the portable families compile for
these plain targets; an architecture-specific one such as Hopper's ``sm_90a`` is added by the
build, :data:`codegen.build.TARGET_SMEM_LIMIT`).
"""

from __future__ import annotations

#: Max dynamic shared memory per block after opt-in, per architecture (CUDA programming guide).
ARCH_SMEM_LIMIT: dict[str, int] = {
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_89": 99 * 1024,
    "sm_90": 227 * 1024,
}
SUPPORTED_ARCHS: tuple[str, ...] = tuple(ARCH_SMEM_LIMIT)
DEFAULT_SMEM_LIMIT = ARCH_SMEM_LIMIT["sm_90"]
