"""A family's C++ text derived from its config's parameter declarations.

:mod:`core.config_common` declares each parameter once; here that declaration gives the
arguments of the family's instantiation macro and of its C++ ``Traits``: the common three
(D, the element type, causal), then every parameter declared ``traits=True`` in field order.
A parameter with its own ``macro`` picks that macro when set and is no macro argument; an
optional parameter is left off the end of the ``Traits`` arguments at its default (those
parameters are the template's last, defaulted ones, so other configs' aliases keep their
text).

A config with an attention-variant switch set (:func:`core.config_common.variant_switch`) is
instantiated with the family's *variant macro* instead, whose arguments are every ``Traits``
argument in order (the mode parameters such as ``varlen`` included, the switches last): one
macro serves every combination, and its kernel takes ``FaVariant`` after the plain kernel's
arguments.

A KV-cache config (:func:`core.config_common.kvcache_switch` set) is instantiated with the
family's *cache macro* over every ``Traits`` argument, the variant switches and the page size
included, and named by its family's cache traits type; the cache parameters are nobody
else's arguments, so the other configs' text stays what it was.
"""

from __future__ import annotations

from collections.abc import Sequence

from codegen.cpp_text import cpp_bool
from core.config_common import FamilyConfigBase
from core.elements import element


def _cpp(value: object) -> str:
    return cpp_bool(value) if isinstance(value, bool) else str(value)


def cpp_args(config: FamilyConfigBase, *, traits: bool, every: bool = False) -> list[str]:
    """The C++ template arguments of ``config``: the ``Traits``' (``traits``) or the
    instantiation macro's after the kernel name (``every``: the variant macro's, every
    ``Traits`` argument)."""
    spec = config.spec
    cache = config.has_cache
    params = [
        p for p in spec.params
        if p.traits and (cache or not p.cache)
        and (traits or every or cache or (p.macro is None and not p.variant))
    ]  # fmt: skip
    values = [getattr(config, p.name) for p in params]
    if traits and not cache:  # the cache traits type has no defaulted arguments
        while params and params[-1].optional and values[-1] == spec.defaults[params[-1].name]:
            params.pop()
            values.pop()
    common = [str(config.d), element(config.dtype).cuda_type, cpp_bool(config.causal)]
    return common + [_cpp(v) for v in values]


def instantiation(
    config: FamilyConfigBase,
    include: str,
    macro: str,
    variant_macro: str | None = None,
    cache_macro: str | None = None,
) -> str:
    """The ``.cu`` text of one config: ``#include`` of the family's template and one macro
    line (``macro``, or the macro of the first set parameter that declares one; a config
    with a variant switch set: ``variant_macro`` over every Traits argument; a KV-cache
    config: ``cache_macro`` over every Traits argument and the page size).

    Raises:
        ValueError: a config with a variant switch of a family without ``variant_macro``,
            or a cache config of one without ``cache_macro``.
    """
    if config.has_cache:
        if cache_macro is None:
            raise ValueError(f"{config.name}: the {config.family} family has no cache kernels")
        args = ", ".join([config.name, *cpp_args(config, traits=False, every=True)])
        return f'#include "{include}"\n{cache_macro}({args})\n'
    if config.has_variant:
        if variant_macro is None:
            raise ValueError(f"{config.name}: the {config.family} family has no variant kernels")
        args = ", ".join([config.name, *cpp_args(config, traits=False, every=True)])
        return f'#include "{include}"\n{variant_macro}({args})\n'
    chosen = next(
        (p.macro for p in config.spec.params if p.macro and getattr(config, p.name)), macro
    )
    args = ", ".join([config.name, *cpp_args(config, traits=False)])
    return f'#include "{include}"\n{chosen}({args})\n'


def variant_reasons(config: FamilyConfigBase, built: Sequence[str]) -> list[str]:
    """Why ``config``'s variant switches are outside its family's space: a switch set that
    the family's kernels are not built with (``built``: the switches they take)."""
    return [
        f"the {config.family} family has no {name} kernels"
        for name, on in config.variant_switches.items()
        if on and name not in built
    ]


def traits(config: FamilyConfigBase, template: str) -> str:
    """The C++ type naming ``config`` (``fa2::Traits<...>``)."""
    return f"{template}<{', '.join(cpp_args(config, traits=True))}>"


def basic_reasons(config: FamilyConfigBase, head_dims: Sequence[int]) -> list[str]:
    """The space rules every family states first: an fp16/bf16 dtype and one of its head
    dims (the reasons' words are those the families' checks have always given)."""
    why: list[str] = []
    if config.dtype not in ("fp16", "bf16"):
        why.append(f"dtype {config.dtype!r} is not fp16 or bf16")
    if config.d not in head_dims:
        why.append(f"head dim {config.d} is not one of {list(head_dims)}")
    return why


def outside(config: FamilyConfigBase, **choices: Sequence[int]) -> list[str]:
    """``<param> <value> is not one of [...]`` for each parameter outside its choices."""
    return [
        f"{name} {getattr(config, name)} is not one of {list(values)}"
        for name, values in choices.items()
        if getattr(config, name) not in values
    ]
