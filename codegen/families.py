"""The kernel-family registry: everything a stage needs to know about one kernel template.

A family is one hand-written template with its own compile-time parameters. Its entry here
names the template files (they are hashed into every build of the family), the config type and
name prefix (:mod:`core.family`), the architectures it compiles for, its space rules, seeds
and default config, how an instantiation file is rendered, its launch geometry and any
host-side preparation before a launch (the Hopper family will need TMA descriptors, built by
the GPU-measurement stage from the tensors), and its part of the exported header.

Stages ask the registry instead of importing a family's modules: a new family is one more
entry, not one more branch in every stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from codegen import fa3_space, splitkv_space
from codegen import space as fa2_space
from codegen.render import render_instantiation
from core.config import HEAD_DIMS, HEAD_DIMS_RULE, Dtype, Fa2Config
from core.elements import element
from core.fa3_config import Fa3Config
from core.family import AnyConfig, UnknownFamilyError, config_type
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig

Grid = tuple[int, int, int]


@dataclass(frozen=True)
class HeaderPart:
    """A family's part of the exported header (codegen/export.py renders it into the table).

    Attributes:
        template: the file under ``codegen/templates`` the header's dispatch code includes
            for this family (kernel template and host launcher); the exporter inlines it only
            when the header holds a config of the family.
        traits: the C++ type that names one config (``fa2::Traits<...>``).
        kernel: the C++ kernel template, instantiated once per config (``fa2::fwd_kernel``).
        launcher: the C++ host launcher template, ``cudaError_t (const FaParams&,
            cudaStream_t)``, instantiated once per config; the dispatch table points at it.
        kernel_params: the kernel's parameter list as its explicit instantiation spells it
            (with the ``__grid_constant__`` annotations, which must repeat the template's).
        guard: the C++ template ``bool (const FaParams&)`` saying whether the launcher can
            run a launch on the current device, instantiated once per config and asked by the
            dispatch before it picks one of the family's configs; None when the family runs
            wherever the header's code does.
        varlen_kernel: the packed variable-length kernel template (``fa2::fwd_varlen_kernel``,
            taking ``FaVarlen`` after ``FaParams``), instantiated instead of ``kernel`` for a
            config whose ``varlen`` is set; None for a family without varlen kernels.
        varlen_launcher: its host launcher, ``cudaError_t (const FaParams&, const FaVarlen&,
            cudaStream_t)`` (``fa2::launch_varlen``); the varlen dispatch table points at it.
        varlen_kernel_params: the varlen kernel's parameter list as its explicit
            instantiation spells it (fa3's: ``fa3::VarlenArgs`` and the three descriptors).
        varlen_guard: as ``guard``, for packed launches: ``bool (const FaParams&, const
            FaVarlen&)``, asked before the varlen dispatch picks one of the family's configs;
            None when they run wherever the header's code does.
    """

    template: str
    traits: Callable[[AnyConfig], str]
    kernel: str
    launcher: str
    kernel_params: str = "const FaParams"
    guard: str | None = None
    varlen_kernel: str | None = None
    varlen_launcher: str | None = None
    varlen_kernel_params: str = "const FaParams, const FaVarlen"
    varlen_guard: str | None = None

    def instantiations(self, alias: str, *, varlen: bool = False) -> list[str]:
        """Explicit instantiations of the kernel, the launcher and the guard for an alias;
        with ``varlen``, of the varlen kernel, launcher and guard (a varlen config's kernel
        static_asserts against the dense entry points, so it gets only these).

        Raises:
            ValueError: ``varlen`` for a family without varlen kernels.
        """
        if varlen:
            if self.varlen_kernel is None or self.varlen_launcher is None:
                raise ValueError(f"{self.kernel}: this family has no varlen kernels")
            lines = [
                f"template __global__ void {self.varlen_kernel}<{alias}>"
                f"({self.varlen_kernel_params});",
                f"template cudaError_t {self.varlen_launcher}<{alias}>"
                "(const FaParams&, const FaVarlen&, cudaStream_t);",
            ]
            if self.varlen_guard is not None:
                guard = f"{self.varlen_guard}<{alias}>"
                lines.append(f"template bool {guard}(const FaParams&, const FaVarlen&);")
            return lines
        lines = [
            f"template __global__ void {self.kernel}<{alias}>({self.kernel_params});",
            f"template cudaError_t {self.launcher}<{alias}>(const FaParams&, cudaStream_t);",
        ]
        if self.guard is not None:
            lines.append(f"template bool {self.guard}<{alias}>(const FaParams&);")
        return lines


@dataclass(frozen=True)
class Family:
    """One kernel family.

    Attributes:
        name: the family's name, also its config names' prefix (``fa2``).
        summary: one line for people.
        templates: files under ``codegen/templates`` its kernels include (hashed per build).
        archs: the ``-gencode`` targets it compiles for, newest first (``sm_90``, ...).
        space: every valid config for (d, dtype, causal, shared-memory limit, arch).
        check: whether one config is in the space, under a shared-memory limit, with the
            broken rule's description when it is not.
        seeds: known-good configs a search starts from.
        default: the config used where nothing was tuned.
        render: the ``.cu`` text of one instantiation.
        grid: launch grid of a config on a call's shape.
        host_prep: dotted name (``module:function``) of the GPU stage's preparation of extra
            launch arguments, or None when the kernel takes only its ``FaParams``.
        header: this family's part of the exported header.
        serves: whether a campaign searches the family on a problem (every family is correct
            on every shape; this only keeps a family off problems it cannot win).
        head_dims: the head dims it has instantiations for (its space is empty for others).
    """

    name: str
    summary: str
    templates: tuple[str, ...]
    archs: tuple[str, ...]
    space: Callable[[int, Dtype, bool, int, str], list[AnyConfig]]
    check: Callable[[AnyConfig, int], tuple[bool, str]]
    seeds: Callable[[int, Dtype, bool], list[AnyConfig]]
    default: Callable[[int, Dtype, bool], AnyConfig]
    render: Callable[[AnyConfig], str]
    grid: Callable[[AnyConfig, Shape], Grid]
    header: HeaderPart
    host_prep: str | None = None
    serves: Callable[[Problem], bool] = lambda problem: True
    head_dims: tuple[int, ...] = HEAD_DIMS

    @property
    def head_dims_text(self) -> str:
        """:attr:`head_dims` for people: the rule when it is every supported one, else the list."""
        if self.head_dims == HEAD_DIMS:
            return HEAD_DIMS_RULE
        return ", ".join(map(str, self.head_dims))

    @property
    def config_type(self) -> type[AnyConfig]:
        return config_type(self.name)

    def block(self, config: AnyConfig) -> Grid:
        """Threads per block, as a launch's block dimensions."""
        return (config.threads, 1, 1)

    def arch_for(self, compute_capability: str) -> str | None:
        """The target this family builds for a GPU of ``compute_capability`` (``"9.0"``).

        The newest target the GPU runs. Builds are cubins of machine code only (no PTX for
        the driver to compile), so a plain target (``sm_86``) runs on GPUs of the same major
        version and an equal or newer minor one, and an architecture-specific target
        (``sm_90a``) on exactly its compute capability. None when no target fits.
        """
        major, minor = (int(x) for x in compute_capability.split(".")[:2])
        for arch in self.archs:
            digits = arch.removeprefix("sm_").rstrip("a")
            t_major, t_minor = int(digits[:-1]), int(digits[-1])
            if arch.endswith("a"):
                if (t_major, t_minor) == (major, minor):
                    return arch
            elif t_major == major and t_minor <= minor:
                return arch
        return None


def _fa2_grid(config: AnyConfig, shape: Shape) -> Grid:
    assert isinstance(config, Fa2Config)
    return (-(-shape.nq // config.br), shape.heads, shape.batch)  # ceil(nq / br) query tiles


def _fa2_traits(config: AnyConfig) -> str:
    assert isinstance(config, Fa2Config)
    c = config
    flags = ("true" if c.causal else "false", "true" if c.swizzle else "false")
    args = (c.d, element(c.dtype).cuda_type, flags[0], c.br, c.bc, c.warps, c.stages, c.pad)
    # Varlen is the Traits' last parameter, defaulted to false: dense aliases keep their text.
    tail = ", true" if c.varlen else ""
    return f"fa2::Traits<{', '.join(map(str, args))}, {flags[1]}{tail}>"


def _fa2_render(config: AnyConfig) -> str:
    assert isinstance(config, Fa2Config)
    return render_instantiation(config)


def _fa2_space(d: int, dtype: Dtype, causal: bool, smem_limit: int, arch: str) -> list[AnyConfig]:
    return list(fa2_space.enumerate_space(d, dtype, causal, smem_limit=smem_limit, arch=arch))


def _fa2_check(config: AnyConfig, smem_limit: int) -> tuple[bool, str]:
    assert isinstance(config, Fa2Config)
    return fa2_space.is_valid(config, smem_limit)


def _fa2_seeds(d: int, dtype: Dtype, causal: bool) -> list[AnyConfig]:
    return list(fa2_space.seed_configs(d, dtype, causal))


FA2 = Family(
    name="fa2",
    summary="portable FlashAttention-2 forward: mma.sync m16n8k16, ldmatrix, cp.async (sm_80+)",
    templates=("fa2_fwd.cuh",),
    archs=tuple(sorted(fa2_space.SUPPORTED_ARCHS, key=lambda a: int(a[3:].rstrip("a")))[::-1]),
    space=_fa2_space,
    check=_fa2_check,
    seeds=_fa2_seeds,
    default=fa2_space.fa2_default_config,
    render=_fa2_render,
    grid=_fa2_grid,
    header=HeaderPart(
        template="fa2_fwd.cuh",
        traits=_fa2_traits,
        kernel="fa2::fwd_kernel",
        launcher="fa2::launch",
        varlen_kernel="fa2::fwd_varlen_kernel",
        varlen_launcher="fa2::launch_varlen",
    ),
    head_dims=fa2_space.VALID_HEAD_DIMS,
)


def _fa3_config(config: AnyConfig) -> Fa3Config:
    assert isinstance(config, Fa3Config)
    return config


def _fa3_grid(config: AnyConfig, shape: Shape) -> Grid:
    return (-(-shape.nq // _fa3_config(config).block_m), shape.heads, shape.batch)


def _fa3_space(d: int, dtype: Dtype, causal: bool, smem_limit: int, arch: str) -> list[AnyConfig]:
    if d not in fa3_space.HEAD_DIMS:
        return []  # head dims the family has no instantiation for: the other family serves
    return [c for c in fa3_space.enumerate_space(d, dtype, causal) if c.smem_bytes <= smem_limit]


def _fa3_check(config: AnyConfig, smem_limit: int) -> tuple[bool, str]:
    c = _fa3_config(config)
    ok, reason = fa3_space.is_valid(c)
    if ok and c.smem_bytes > smem_limit:
        return False, f"needs {c.smem_bytes} bytes of shared memory, over {smem_limit}"
    return ok, reason


def _fa3_seeds(d: int, dtype: Dtype, causal: bool) -> list[AnyConfig]:
    return list(fa3_space.seed_configs(d, dtype, causal)) if d in fa3_space.HEAD_DIMS else []


def _fa3_render(config: AnyConfig) -> str:
    c = _fa3_config(config)

    def flag(value: bool) -> str:
        return "true" if value else "false"

    args = (
        c.name, c.d, element(c.dtype).cuda_type, flag(c.causal), c.block_m, c.block_n,
        c.stages, flag(c.pv_regs), flag(c.overlap), flag(c.pingpong), c.consumer_regs,
    )  # fmt: skip
    # A varlen config is its own kernel symbol (FaVarlen's bytes before the descriptors); a
    # longest-first one its own Traits (fa3_fwd.cuh's macros).
    macro = "FA3_DEFINE_KERNEL"
    if c.varlen:
        macro = "FA3_DEFINE_VARLEN_KERNEL"
    elif c.longest_first:
        macro = "FA3_DEFINE_LONGEST_FIRST_KERNEL"
    return f'#include "fa3_fwd.cuh"\n{macro}({", ".join(map(str, args))})\n'


def _fa3_traits(config: AnyConfig) -> str:
    c = _fa3_config(config)
    flags = [("true" if x else "false") for x in (c.causal, c.pv_regs, c.overlap, c.pingpong)]
    args = (
        c.d, element(c.dtype).cuda_type, flags[0], c.block_m, c.block_n, c.stages,
        flags[1], flags[2], flags[3], c.consumer_regs,
    )  # fmt: skip
    # Varlen and LongestFirst are the Traits' last parameters, defaulted to false: other
    # configs' aliases keep their text.
    tail = ", true" if c.varlen else ", false, true" if c.longest_first else ""
    return f"fa3::Traits<{', '.join(map(str, args))}{tail}>"


FA3 = Family(
    name="fa3",
    summary="Hopper-native FA forward: wgmma, TMA, warp-specialized producer/consumers (sm_90a)",
    templates=("fa3_fwd.cuh",),
    archs=(fa3_space.ARCH,),
    space=_fa3_space,
    check=_fa3_check,
    seeds=_fa3_seeds,
    default=fa3_space.default_config,
    render=_fa3_render,
    grid=_fa3_grid,
    header=HeaderPart(
        template="fa3_launch.cuh",  # includes fa3_fwd.cuh
        traits=_fa3_traits,
        kernel="fa3::fwd_kernel",
        launcher="fa3::launch",
        kernel_params=", ".join(
            ["const FaParams"] + ["const __grid_constant__ CUtensorMap"] * 3
        ),  # p, tma_q, tma_k, tma_v (docs/fa3_kernel.md)
        guard="fa3::can_launch",
        varlen_kernel="fa3::fwd_varlen_kernel",
        varlen_launcher="fa3::launch_varlen",
        varlen_kernel_params=", ".join(
            ["const FaParams", "const fa3::VarlenArgs"]
            + ["const __grid_constant__ CUtensorMap"] * 3
        ),  # p, vl, tma_q, tma_k, tma_v over the packed tensors
        varlen_guard="fa3::can_launch_varlen",
    ),
    host_prep="measure.tma:fa3_tensor_maps",
    head_dims=fa3_space.HEAD_DIMS,
)


def _splitkv_config(config: AnyConfig) -> SplitKvConfig:
    assert isinstance(config, SplitKvConfig)
    return config


def _splitkv_grid(config: AnyConfig, shape: Shape) -> Grid:
    # (row tiles x KV heads x batch, splits): batch x heads in x, whose limit is 2^31 - 1.
    c = _splitkv_config(config)
    row_tiles = -(-shape.group * shape.nq // c.rows)
    return (row_tiles * shape.kv_heads * shape.batch, c.splits_for(shape.nk), 1)


def _splitkv_space(
    d: int, dtype: Dtype, causal: bool, smem_limit: int, arch: str
) -> list[AnyConfig]:
    return list(splitkv_space.enumerate_space(d, dtype, causal, smem_limit))


def _splitkv_check(config: AnyConfig, smem_limit: int) -> tuple[bool, str]:
    return splitkv_space.is_valid(_splitkv_config(config), smem_limit)


def _splitkv_seeds(d: int, dtype: Dtype, causal: bool) -> list[AnyConfig]:
    return list(splitkv_space.seed_configs(d, dtype, causal))


def _splitkv_args(config: AnyConfig) -> tuple[object, ...]:
    c = _splitkv_config(config)
    causal = "true" if c.causal else "false"
    return (c.d, element(c.dtype).cuda_type, causal, c.rows, c.block_n, c.warps, c.stages,
            c.splits)  # fmt: skip


def _splitkv_render(config: AnyConfig) -> str:
    args = ", ".join(map(str, (config.name, *_splitkv_args(config))))
    return f'#include "splitkv_fwd.cuh"\nSPLITKV_DEFINE_KERNEL({args})\n'


def _splitkv_traits(config: AnyConfig) -> str:
    return f"splitkv::Traits<{', '.join(map(str, _splitkv_args(config)))}>"


SPLITKV = Family(
    name="splitkv",
    summary="split-KV decode forward: packed GQA rows, warps and blocks split the keys (sm_80+)",
    templates=("splitkv_fwd.cuh",),
    archs=FA2.archs,
    space=_splitkv_space,
    check=_splitkv_check,
    seeds=_splitkv_seeds,
    default=splitkv_space.default_config,
    render=_splitkv_render,
    grid=_splitkv_grid,
    header=HeaderPart(
        template="splitkv_launch.cuh",  # includes splitkv_fwd.cuh
        traits=_splitkv_traits,
        kernel="splitkv::fwd_kernel",
        launcher="splitkv::launch",
        kernel_params="const FaParams, float*, float*, int*",  # p, ws_o, ws_lse, ws_count
    ),
    host_prep="measure.splitkv:splitkv_workspace",
    serves=splitkv_space.serves,
    head_dims=splitkv_space.HEAD_DIMS,
)

#: Every family, by name; the order is the order a campaign searches them in.
FAMILIES: dict[str, Family] = {f.name: f for f in (FA2, FA3, SPLITKV)}


def family(name: str) -> Family:
    """The registered family called ``name``.

    Raises:
        UnknownFamilyError: no such family.
    """
    try:
        return FAMILIES[name]
    except KeyError:
        known = ", ".join(FAMILIES)
        raise UnknownFamilyError(f"unknown kernel family {name!r} (known: {known})") from None


def family_of(config: AnyConfig) -> Family:
    """The family a config belongs to."""
    return family(config.family)


def families_for(compute_capability: str) -> Sequence[Family]:
    """The families that can run on a GPU of ``compute_capability``, in search order."""
    return [f for f in FAMILIES.values() if f.arch_for(compute_capability) is not None]
