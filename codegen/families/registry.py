"""The kernel-family registry: everything a stage needs to know about one kernel template.

A family is one hand-written template with its own compile-time parameters. Its entry
(:class:`Family`) names the template files (they are hashed into every build of the family),
the config type and name prefix (:mod:`core.family`), the architectures it compiles for, its
space rules, seeds and default config, how an instantiation file is rendered, its launch
geometry, its host-side preparation before a launch (a callable: fa3's TMA descriptors,
splitkv's workspace), its part of the exported header, its search parameters (from its
config's declarations) and whether it has packed variable-length kernels.

Stages ask the registry instead of importing a family's modules or branching on its name: a
new family is one folder under ``codegen/families`` and one :func:`register` call (the
built-in ones in ``codegen/families/__init__.py``; a test or a plug-in may register more at
run time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, cast

from codegen.targets import runs_on
from core.config import HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.config_common import SearchValue
from core.family import (
    AnyConfig,
    config_type,
    lookup,
    register_config_type,
    unregister_config_type,
)
from core.problem import Problem
from core.shape import Shape

Grid = tuple[int, int, int]
_NO_SMEM_LIMIT = 1 << 40  # a twin's shared memory is its dense config's, checked already
#: A family's host preparation: ``(config, q, k, v, layout)`` -> the kernel's arguments
#: after its ``FaParams``, in order, each a ctypes value whose bytes are the argument. It
#: imports torch / cuda-bindings only when called (the registry is imported without them).
HostPrep: TypeAlias = Callable[..., Sequence[Any]]


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
        variant_kernel: the kernel template of a config built with an attention-variant
            switch (``fa2::fwd_variant_kernel``, taking ``FaVariant`` last), instantiated
            instead of ``kernel`` for such a config; None for a family the header cannot
            launch variants of. ``guard`` guards these configs too.
        variant_launcher: its host launcher, ``cudaError_t (const FaParams&, const
            FaVariant&, cudaStream_t)`` (``fa2::launch_variant``); the variant dispatch table
            points at it.
        variant_kernel_params: the variant kernel's parameter list as its explicit
            instantiation spells it.
        varlen_variant_kernel, varlen_variant_launcher, varlen_variant_kernel_params: the
            same for a packed variant config (``_vl`` with a switch): the kernel takes
            ``FaVarlen`` and then ``FaVariant``, the launcher ``cudaError_t (const FaParams&,
            const FaVarlen&, const FaVariant&, cudaStream_t)``; ``varlen_guard`` guards them.
        cache_kernel: the KV-cache kernel template of a config built with its family's cache
            switch (``splitkv::fwd_cache_kernel``, taking ``FaVariant`` and ``FaKvCache``
            last); None for a family without cache kernels in the header.
        cache_launcher: its host launcher, ``cudaError_t (const FaParams&, const FaVariant&,
            const FaKvCache&, cudaStream_t)`` (a workspace of the header's own, as
            ``launcher``'s); the KV-cache table points at it.
        cache_workspace_launcher: its launcher with the caller's workspace, ``cudaError_t
            (const FaParams&, const FaVariant&, const FaKvCache&, void*, size_t,
            cudaStream_t)``.
        cache_workspace_size: the bytes of caller workspace a cache launch needs,
            ``size_t (const FaParams&)``.
        cache_kernel_params: the cache kernel's parameter list as its explicit instantiation
            spells it.
        append_kernel: the kernel that writes a call's new K/V rows into the cache
            (``splitkv::append_kernel``, taking ``FaParams``, ``FaKvAppend``, ``FaKvCache``),
            instantiated once per cache config beside it (the Python side loads it from the
            config's cubin as ``<name>_append``).
        append_launcher: its host launcher, ``cudaError_t (const FaParams&, const
            FaKvAppend&, const FaKvCache&, cudaStream_t)``.
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
    variant_kernel: str | None = None
    variant_launcher: str | None = None
    variant_kernel_params: str = "const FaParams, const FaVariant"
    varlen_variant_kernel: str | None = None
    varlen_variant_launcher: str | None = None
    varlen_variant_kernel_params: str = "const FaParams, const FaVarlen, const FaVariant"
    cache_kernel: str | None = None
    cache_launcher: str | None = None
    cache_workspace_launcher: str | None = None
    cache_workspace_size: str | None = None
    cache_kernel_params: str = "const FaParams, const FaVariant, const FaKvCache"
    append_kernel: str | None = None
    append_launcher: str | None = None

    @property
    def variants(self) -> bool:
        """Whether the header can launch the family's dense variant configs."""
        return self.variant_kernel is not None and self.variant_launcher is not None

    @property
    def varlen_variants(self) -> bool:
        """Whether the header can launch the family's packed variant configs."""
        return self.varlen_variant_kernel is not None and self.varlen_variant_launcher is not None

    @property
    def caches(self) -> bool:
        """Whether the header can launch the family's KV-cache configs (and their appends)."""
        return None not in (
            self.cache_kernel,
            self.cache_launcher,
            self.cache_workspace_launcher,
            self.cache_workspace_size,
            self.append_kernel,
            self.append_launcher,
        )

    def instantiations(
        self, alias: str, *, varlen: bool = False, variant: bool = False, cache: bool = False
    ) -> list[str]:
        """Explicit instantiations of the kernel, the launcher and the guard for an alias;
        with ``varlen``, of the varlen kernel, launcher and guard (a varlen config's kernel
        static_asserts against the dense entry points, so it gets only these); with
        ``variant``, of the variant kernel and launcher of the mode (and its guard); with
        ``cache``, of the KV-cache kernel, its launchers and the append kernel and launcher.

        Raises:
            ValueError: ``varlen`` for a family without varlen kernels, ``variant`` for one
                without (that mode's) variant kernels in the header, ``cache`` for one
                without cache kernels there.
        """
        if cache:
            return self._cache_instantiations(alias)
        if variant:
            return self._variant_instantiations(alias, varlen)
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

    def _cache_instantiations(self, alias: str) -> list[str]:
        if not self.caches:
            raise ValueError(f"{self.kernel}: the header has no KV-cache kernels of it")
        cache = "const FaParams&, const FaVariant&, const FaKvCache&"
        return [
            f"template __global__ void {self.cache_kernel}<{alias}>({self.cache_kernel_params});",
            f"template cudaError_t {self.cache_launcher}<{alias}>({cache}, cudaStream_t);",
            f"template cudaError_t {self.cache_workspace_launcher}<{alias}>"
            f"({cache}, void*, size_t, cudaStream_t);",
            f"template size_t {self.cache_workspace_size}<{alias}>(const FaParams&);",
            f"template __global__ void {self.append_kernel}<{alias}>"
            "(const FaParams, const FaKvAppend, const FaKvCache);",
            f"template cudaError_t {self.append_launcher}<{alias}>"
            "(const FaParams&, const FaKvAppend&, const FaKvCache&, cudaStream_t);",
        ]

    def _variant_instantiations(self, alias: str, varlen: bool) -> list[str]:
        if varlen:
            if self.varlen_variant_kernel is None or self.varlen_variant_launcher is None:
                raise ValueError(f"{self.kernel}: the header has no packed variant kernels of it")
            lines = [
                f"template __global__ void {self.varlen_variant_kernel}<{alias}>"
                f"({self.varlen_variant_kernel_params});",
                f"template cudaError_t {self.varlen_variant_launcher}<{alias}>"
                "(const FaParams&, const FaVarlen&, const FaVariant&, cudaStream_t);",
            ]
            if self.varlen_guard is not None:
                guard = f"{self.varlen_guard}<{alias}>"
                lines.append(f"template bool {guard}(const FaParams&, const FaVarlen&);")
            return lines
        if self.variant_kernel is None or self.variant_launcher is None:
            raise ValueError(f"{self.kernel}: the header has no variant kernels of it")
        lines = [
            f"template __global__ void {self.variant_kernel}<{alias}>"
            f"({self.variant_kernel_params});",
            f"template cudaError_t {self.variant_launcher}<{alias}>"
            "(const FaParams&, const FaVariant&, cudaStream_t);",
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
        host_prep: the GPU stage's preparation of extra launch arguments (:data:`HostPrep`),
            or None when the kernel takes only its ``FaParams``.
        varlen_host_prep: as ``host_prep`` for a packed (``_vl``) launch, ``(config, q, k,
            v)`` over the packed ``[total, heads, D]`` tensors: the arguments after
            ``FaParams`` and ``FaVarlen``; None when those are all.
        cache_host_prep: as ``host_prep`` for a KV-cache (``_kvc``) launch, ``(config, q,
            k_cache, v_cache, capacity)`` over the caches as they are (``[rows, capacity,
            Hkv, D]`` or pages ``[pages, P, Hkv, D]``): the arguments between ``FaParams``
            and ``FaVariant``; None: ``host_prep`` over ``[B, capacity, Hkv, D]`` stand-ins
            (a family whose preparation reads only shapes, as split-KV's workspace).
        header: this family's part of the exported header.
        serves: whether a campaign searches the family on a problem (every family is correct
            on every shape; this only keeps a family off problems it cannot win).
        serves_cache: whether its cache kernels serve a KV-cache call or problem of this many
            query rows (the Hopper family's are for chunked prefill, not decode steps): the
            campaign and the op ask it.
        head_dims: the head dims it has instantiations for (its space is empty for others).
        est_registers: the space's register estimate per thread (``fa2tune space``).
        columns: extra columns of ``fa2tune space --json`` for one config.
        variant_switches: the attention-variant switches its kernels are built with
            (:data:`core.variant.SWITCHES` they take; a config with another set is outside
            its space, and a campaign passes the family over for such a problem).
        fit: how the family shrinks a config to a shared-memory limit (``(config, limit) ->
            config or None``), applied to its default on GPUs with less shared memory than
            the default was sized for (:meth:`default_within`); None: configs are not shrunk.
        workspace_sizes: for a family whose kernels merge partial results through a
            workspace (split-KV): ``(config, shape) -> (counters, partial rows)``, int32
            counters (zero before a launch) and float32 rows of ``d + 1`` (partial O, LSE);
            ``(0, 0)`` when a launch needs none. None: its kernels take no workspace.
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
    host_prep: HostPrep | None = None
    varlen_host_prep: HostPrep | None = None
    cache_host_prep: HostPrep | None = None
    serves: Callable[[Problem], bool] = lambda problem: True
    serves_cache: Callable[[int], bool] = lambda nq: True
    head_dims: tuple[int, ...] = HEAD_DIMS
    est_registers: Callable[[AnyConfig], int] = lambda config: 0
    columns: Callable[[AnyConfig], dict[str, object]] = lambda config: {}
    variant_switches: tuple[str, ...] = ()
    workspace_sizes: Callable[[AnyConfig, Shape], tuple[int, int]] | None = None
    fit: Callable[[AnyConfig, int], AnyConfig | None] | None = None

    def default_within(
        self, d: int, dtype: Dtype, causal: bool, smem_limit: int | None
    ) -> AnyConfig | None:
        """The default config, fitted to ``smem_limit`` bytes of shared memory per block
        (a target's or a device's; None: no limit): the default where it fits, else the
        family's :attr:`fit` of it, else None.

        Raises:
            ValueError: a head dim the family has no default for.
        """
        config = self.default(d, dtype, causal)
        if smem_limit is None or self.check(config, smem_limit)[0]:
            return config
        return self.fit(config, smem_limit) if self.fit is not None else None

    @property
    def head_dims_text(self) -> str:
        """:attr:`head_dims` for people: the rule when it is every supported one, else the list."""
        if self.head_dims == HEAD_DIMS:
            return HEAD_DIMS_RULE
        return ", ".join(map(str, self.head_dims))

    @property
    def config_type(self) -> type[AnyConfig]:
        return config_type(self.name)

    @property
    def search_names(self) -> tuple[str, ...]:
        """The family's optuna parameter names, in draw order (its config's declarations)."""
        return self.config_type.spec.search_names

    def search_params(self, config: AnyConfig) -> dict[str, SearchValue]:
        """The optuna parameters that pick ``config`` among the family's of its group."""
        return config.search_params()

    def choice_order(self, name: str) -> tuple[str, ...] | None:
        """The declared order of search parameter ``name``'s values (None: sorted)."""
        spec = self.config_type.spec
        return next((p.search_order for p in spec.params if p.search == name), None)

    @property
    def added_search_defaults(self) -> dict[str, SearchValue]:
        """Search parameters added after studies were stored, with the value every config
        had before (a resumed study without them keeps searching those configs)."""
        return self.config_type.spec.added_search_defaults

    @property
    def varlen(self) -> bool:
        """Whether the family has packed variable-length (``_vl``) kernels."""
        return self.header.varlen_kernel is not None

    def varlen_twin(self, config: AnyConfig) -> AnyConfig | None:
        """The packed-sequence twin (``_vl``) of a dense ``config``; None when the family has
        no varlen kernels or its space has no such twin (fa3's longest-first order is for
        dense grids). The twin has the dense config's tiles and shared memory."""
        if not self.varlen:
            return None
        twin: AnyConfig = replace(cast(Any, config), varlen=True)  # a varlen family has one
        return twin if self.check(twin, _NO_SMEM_LIMIT)[0] else None

    def block(self, config: AnyConfig) -> Grid:
        """Threads per block, as a launch's block dimensions."""
        return (config.threads, 1, 1)

    def arch_for(self, compute_capability: str) -> str | None:
        """The target this family builds for a GPU of ``compute_capability`` (``"9.0"``).

        The newest of its targets the GPU runs (:func:`codegen.targets.runs_on`: machine code
        only, so a plain target runs within its major version, an architecture-specific one
        such as ``sm_90a`` on exactly its compute capability). None when no target fits.
        """
        return next((a for a in self.archs if runs_on(a, compute_capability)), None)


#: Every family, by name; the order is the order a campaign searches them in.
FAMILIES: dict[str, Family] = {}


def register(entry: Family, config: type[Any]) -> Family:
    """Add a family: its entry here and its config type to :mod:`core.family`.

    Raises:
        ValueError: the names differ, or a family of that name is already registered.
    """
    if config.family != entry.name:
        raise ValueError(f"config type {config.__name__} is of family {config.family!r}")
    if entry.name in FAMILIES:
        raise ValueError(f"kernel family {entry.name!r} is already registered")
    register_config_type(config)
    FAMILIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a family added by :func:`register` (tests that add a toy one)."""
    FAMILIES.pop(name, None)
    unregister_config_type(name)


def family(name: str) -> Family:
    """The registered family called ``name``.

    Raises:
        UnknownFamilyError: no such family.
    """
    return lookup(FAMILIES, name)


def family_of(config: AnyConfig) -> Family:
    """The family a config belongs to."""
    return family(config.family)


def families_for(compute_capability: str) -> Sequence[Family]:
    """The families that can run on a GPU of ``compute_capability``, in search order."""
    return [f for f in FAMILIES.values() if f.arch_for(compute_capability) is not None]
