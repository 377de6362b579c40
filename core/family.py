"""Kernel families: which config type a family name or a config name belongs to.

A family is one hand-written kernel template with its own compile-time parameters (the
mma.sync template is family ``fa2``). Every stage after code generation treats the family as
one more field: a config name starts with its family's prefix (``fa2_...``), the store keeps
the family and the family's own parameters, and dumps, answers and headers carry both. This
module is the one place that maps a family name or a config name to the config type; the
templates, space rules, launch geometry and header parts of a family are registered with
:mod:`codegen.families`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, Protocol, TypeAlias, TypeVar, cast

from core.config import Dtype
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.splitkv_config import SplitKvConfig

T = TypeVar("T")


class FamilyConfig(Protocol):
    """What every family's config type offers (frozen dataclasses, hashable, picklable)."""

    @property
    def family(self) -> str: ...  # a ClassVar on the concrete types

    @property
    def d(self) -> int: ...

    @property
    def dtype(self) -> Dtype: ...

    @property
    def causal(self) -> bool: ...

    @property
    def name(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def threads(self) -> int: ...

    @property
    def smem_bytes(self) -> int: ...

    def params(self) -> dict[str, Any]: ...

    def describe(self) -> str: ...


#: Any family's config (a union as families are added; each satisfies :class:`FamilyConfig`).
AnyConfig: TypeAlias = Fa2Config | Fa3Config | SplitKvConfig

#: Family name -> config type. A family's name is also its config names' prefix.
CONFIG_TYPES: dict[str, type[AnyConfig]] = {
    "fa2": Fa2Config,
    "fa3": Fa3Config,
    "splitkv": SplitKvConfig,
}

FAMILIES: tuple[str, ...] = tuple(CONFIG_TYPES)


def register_config_type(cls: type[Any]) -> None:
    """Add a family's config type (its ``family`` is the name and the names' prefix).

    :func:`codegen.families.register` calls it with the rest of the family; the db, the
    service and dumps then read the family's configs like the built-in ones.

    Raises:
        ValueError: a family of that name is already registered.
    """
    global FAMILIES
    name = str(cls.family)
    if name in CONFIG_TYPES:
        raise ValueError(f"kernel family {name!r} is already registered")
    CONFIG_TYPES[name] = cls
    FAMILIES = tuple(CONFIG_TYPES)


def unregister_config_type(name: str) -> None:
    """Remove a family added by :func:`register_config_type` (tests that add a toy one)."""
    global FAMILIES
    CONFIG_TYPES.pop(name, None)
    FAMILIES = tuple(CONFIG_TYPES)


class UnknownFamilyError(ValueError):
    """A family name, or a config name whose prefix names no family."""


def lookup(table: Mapping[str, T], family: str) -> T:
    """``table[family]`` for a table keyed by family name (this map, codegen's registry).

    Raises:
        UnknownFamilyError: no such family.
    """
    try:
        return table[family]
    except KeyError:
        known = ", ".join(table)
        raise UnknownFamilyError(f"unknown kernel family {family!r} (known: {known})") from None


def config_type(family: str) -> type[AnyConfig]:
    """The config type of ``family``.

    Raises:
        UnknownFamilyError: no such family.
    """
    return lookup(CONFIG_TYPES, family)


def family_of_name(name: str) -> str:
    """The family a config name belongs to, read from its prefix (``fa2_d128_...`` -> fa2).

    Raises:
        UnknownFamilyError: the prefix names no family.
    """
    prefix = name.split("_", 1)[0]
    if prefix not in CONFIG_TYPES:
        known = ", ".join(f"{f}_..." for f in CONFIG_TYPES)
        raise UnknownFamilyError(
            f"not a kernel config name: {name!r} (its prefix names no kernel family; "
            f"known: {known})"
        )
    return prefix


def config_from_name(name: str) -> AnyConfig:
    """Parse any family's config name.

    Raises:
        UnknownFamilyError: the prefix names no family.
        ValueError: the name is not a valid name of that family.
    """
    return config_type(family_of_name(name)).from_name(name)


def config_from_params(
    family: str, d: int, dtype: str, causal: bool, params: Mapping[str, Any]
) -> AnyConfig:
    """Rebuild a config from the columns the store keeps: the common three plus ``params``.

    Raises:
        UnknownFamilyError: no such family.
        ValueError: ``params`` misses a parameter of the family or has one it does not know.
    """
    cls = config_type(family)
    own = {f.name for f in fields(cls)} - {"d", "dtype", "causal"}
    unknown = sorted(set(params) - own)
    if unknown:
        raise ValueError(f"{family} configs have no parameter(s) {', '.join(unknown)}")
    # Stored parameters are complete (no default stands in) except those a config type adds
    # later and leaves out at their default, so that rows stored before them stay the same.
    optional: frozenset[str] = getattr(cls, "optional_params", frozenset())
    missing = sorted(own - set(params) - optional)
    if missing:
        raise ValueError(f"{family} config parameters missing: {', '.join(missing)}")
    return cls.from_dict({"d": d, "dtype": dtype, "causal": causal, **params})


def cache_twin(config: AnyConfig, page: int) -> AnyConfig | None:
    """``config``'s KV-cache kernel of layout ``page`` (``kvcache=True``; 0: a contiguous
    cache) in tile order, or None for a config type without cache kernels. Not checked
    against its family's space (``Family.check`` says whether it is in it)."""
    try:
        twin: AnyConfig = replace(cast(Any, config), kvcache=True, page=page)
    except TypeError:  # no kvcache parameter: the family has no cache kernels
        return None
    if getattr(twin, "longest_first", False):  # a launch order over dense tiles only
        twin = replace(cast(Any, twin), longest_first=False)
    return twin


def cache_twins(config: AnyConfig, page: int) -> list[AnyConfig]:
    """The KV-cache kernels a cache problem of layout ``page`` searches for ``config``'s tile:
    its :func:`cache_twin` and, for each searched flag among the cache parameters (split-KV's
    ``cap_split``), the twin with it set; empty for a config type without cache kernels. Not
    checked against the family's space."""
    twin = cache_twin(config, page)
    if twin is None:
        return []
    spec = getattr(twin, "spec", None)
    flags = [p.name for p in getattr(spec, "params", ()) if p.cache and p.search is not None
             and isinstance(getattr(twin, p.name), bool)]  # fmt: skip
    return [twin, *(replace(cast(Any, twin), **{name: True}) for name in flags)]
