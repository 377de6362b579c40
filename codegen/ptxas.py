"""Parsing ``nvcc -Xptxas -v`` output: resource usage per kernel and error classification.

The format (nvcc 12 and 13) is, per entry function::

    ptxas info    : Compiling entry function 'NAME' for 'sm_90'
    ptxas info    : Function properties for NAME
        88 bytes stack frame, 132 bytes spill stores, 152 bytes spill loads
    ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 88 bytes cumulative
                    stack size, 372 bytes cmem[0]
    ptxas info    : Compile time = 615.678 ms

The "Used" line's fields vary: ``smem``, ``cmem[N]`` and the stack size appear only when
non-zero or relevant to the target (sm_90 output omits ``cmem[0]``), older versions print no
barrier count. "Function properties" also appears for non-inlined device functions, so a stack
line belongs to the function named just above it, not to the entry being compiled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.build_report import BuildStatus

_COMPILING_RE = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPS_RE = re.compile(r"Function properties for (?P<name>\S+)")
_STACK_RE = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, "
    r"(?P<ld>\d+) bytes spill loads"
)
_USED_RE = re.compile(r"Used (?P<regs>\d+) registers(?P<rest>.*)$")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_CMEM_RE = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_CUMULATIVE_STACK_RE = re.compile(r"(\d+) bytes cumulative stack size")
_GMEM_RE = re.compile(r"ptxas info\s*:\s*(\d+) bytes gmem")
_COMPILE_TIME_RE = re.compile(r"Compile time = ([\d.]+) ms")
_SPILL_WARNING_RE = re.compile(
    r"Registers are spilled to local memory in function '(?P<name>[^']+)', "
    r"(?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads"
)
_ERROR_LINE_RE = re.compile(r"error", re.IGNORECASE)

# Known ptxas/nvcc error texts, checked in order; the first match decides the status.
_SMEM_OVERFLOW_RE = re.compile(r"uses too much shared data")
_RESOURCE_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"uses too much \w+ (?:data|space)"),  # local, parameter, constant
    re.compile(r"too many resources", re.IGNORECASE),
    re.compile(r"parameter space overflowed", re.IGNORECASE),
)

MAX_EXCERPT_LINES = 8
MAX_EXCERPT_CHARS = 2000


@dataclass(frozen=True)
class PtxasInfo:
    """ptxas's resource report for one kernel on one architecture.

    Attributes:
        kernel: the entry function's (possibly mangled) name.
        found: whether the text holds a "Compiling entry function" section for it.
        arch: the architecture of the section parsed, e.g. ``"sm_90"``.
        registers: registers per thread (None when not reported).
        barriers: named barriers used.
        spill_stores: bytes of spill stores per thread.
        spill_loads: bytes of spill loads per thread.
        stack_bytes: stack frame bytes per thread.
        cumulative_stack: stack size including callees, when reported.
        static_smem: static shared memory bytes (``N bytes smem``).
        cmem: constant bank -> bytes (``N bytes cmem[B]``), as reported.
        gmem: global data bytes of the module (the last ``N bytes gmem`` before the section).
        compile_ms: ptxas's own compile time for the entry.
    """

    kernel: str
    found: bool
    arch: str | None = None
    registers: int | None = None
    barriers: int | None = None
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    cumulative_stack: int = 0
    static_smem: int = 0
    cmem: Mapping[int, int] = field(default_factory=dict)
    gmem: int = 0
    compile_ms: float | None = None

    @property
    def spills(self) -> bool:
        """True when ptxas reports any spill stores or loads."""
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass
class _Section:
    arch: str
    gmem: int
    registers: int | None = None
    barriers: int | None = None
    static_smem: int = 0
    cumulative_stack: int = 0
    cmem: dict[int, int] = field(default_factory=dict)
    compile_ms: float | None = None


def parse_ptxas(text: str, kernel_name: str, arch: str | None = None) -> PtxasInfo:
    """Extract ``kernel_name``'s resource usage from ``nvcc -Xptxas -v`` output.

    Args:
        text: nvcc's combined stdout and stderr.
        kernel_name: the entry function, exactly as ptxas prints it (mangled for C++ names;
            fa2tune kernels are ``extern "C"``).
        arch: pick this architecture's section when the output covers several; by default
            the first section of the kernel.

    Returns:
        The parsed info; ``found`` is False (and ``registers`` None) when the output has no
        section for the kernel, e.g. because compilation failed before ptxas ran.
    """
    sections: list[_Section] = []
    current: _Section | None = None  # the entry whose "Used" line comes next
    props_for: str | None = None  # the function whose stack line comes next
    stack: dict[tuple[str, str | None], tuple[int, int, int]] = {}
    warned: dict[str, tuple[int, int]] = {}
    gmem = 0
    section_arch: str | None = None

    for line in text.splitlines():
        if m := _GMEM_RE.search(line):
            gmem = int(m.group(1))
        if m := _COMPILING_RE.search(line):
            section_arch = m["arch"]
            if m["name"] == kernel_name:
                current = _Section(arch=m["arch"], gmem=gmem)
                sections.append(current)
            else:
                current = None
            continue
        if m := _PROPS_RE.search(line):
            props_for = m["name"]
            continue
        if m := _STACK_RE.search(line):
            if props_for is not None:
                stack[(props_for, section_arch)] = (int(m["stack"]), int(m["st"]), int(m["ld"]))
            props_for = None
            continue
        if m := _SPILL_WARNING_RE.search(line):
            warned[m["name"]] = (int(m["st"]), int(m["ld"]))
            continue
        if current is not None and (m := _USED_RE.search(line)):
            rest = m["rest"]
            current.registers = int(m["regs"])
            if b := _BARRIERS_RE.search(rest):
                current.barriers = int(b.group(1))
            if s := _SMEM_RE.search(rest):
                current.static_smem = int(s.group(1))
            if s := _CUMULATIVE_STACK_RE.search(rest):
                current.cumulative_stack = int(s.group(1))
            current.cmem = {int(bank): int(n) for n, bank in _CMEM_RE.findall(rest)}
            continue
        if current is not None and (m := _COMPILE_TIME_RE.search(line)):
            current.compile_ms = float(m.group(1))
            current = None

    chosen = next((s for s in sections if arch is None or s.arch == arch), None)
    if chosen is None:
        return PtxasInfo(kernel=kernel_name, found=False, arch=arch)
    stack_bytes, spill_st, spill_ld = stack.get((kernel_name, chosen.arch), (0, 0, 0))
    if kernel_name in warned:  # older ptxas with -warn-spills reports spills this way too
        spill_st = max(spill_st, warned[kernel_name][0])
        spill_ld = max(spill_ld, warned[kernel_name][1])
    return PtxasInfo(
        kernel=kernel_name,
        found=True,
        arch=chosen.arch,
        registers=chosen.registers,
        barriers=chosen.barriers,
        spill_stores=spill_st,
        spill_loads=spill_ld,
        stack_bytes=stack_bytes,
        cumulative_stack=chosen.cumulative_stack,
        static_smem=chosen.static_smem,
        cmem=dict(chosen.cmem),
        gmem=chosen.gmem,
        compile_ms=chosen.compile_ms,
    )


def error_excerpt(text: str, max_lines: int = MAX_EXCERPT_LINES) -> str:
    """The first lines of ``text`` that mention an error (case-insensitive), joined.

    Falls back to the last non-empty lines when no line says "error" (a crash, a signal),
    so a failed build always carries some explanation.
    """
    lines = [ln.rstrip() for ln in text.splitlines()]
    picked = [ln.strip() for ln in lines if _ERROR_LINE_RE.search(ln)][:max_lines]
    if not picked:
        picked = [ln.strip() for ln in lines if ln.strip()][-max_lines:]
    excerpt = "\n".join(picked)
    return excerpt[:MAX_EXCERPT_CHARS]


@dataclass(frozen=True)
class CompileError:
    """A compile failure classified by its text.

    Attributes:
        status: ``SMEM_OVERFLOW`` for "uses too much shared data", else ``COMPILE_FAILED``.
        kind: ``"smem"``, ``"resources"`` (too much local/parameter/constant data, too many
            resources) or ``"other"``.
        excerpt: the first error lines of the output.
    """

    status: BuildStatus
    kind: str
    excerpt: str


def classify_errors(text: str, returncode: int = 0) -> CompileError | None:
    """Classify nvcc's output of one build.

    Args:
        text: nvcc's combined output.
        returncode: nvcc's exit status; a non-zero status without any recognisable error line
            is still a failure.

    Returns:
        None when the output reports no error and ``returncode`` is 0, else the
        classification with an excerpt of the error lines.
    """
    error_lines = [ln for ln in text.splitlines() if _ERROR_LINE_RE.search(ln)]
    if not error_lines and returncode == 0:
        return None
    excerpt = error_excerpt(text)
    if returncode != 0 and not excerpt:
        excerpt = f"nvcc exited with status {returncode} and no output"
    joined = "\n".join(error_lines)
    if _SMEM_OVERFLOW_RE.search(joined):
        return CompileError(BuildStatus.SMEM_OVERFLOW, "smem", excerpt)
    if any(r.search(joined) for r in _RESOURCE_RES):
        return CompileError(BuildStatus.COMPILE_FAILED, "resources", excerpt)
    return CompileError(BuildStatus.COMPILE_FAILED, "other", excerpt)
