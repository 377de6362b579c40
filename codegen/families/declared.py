"""A family's C++ text derived from its config's parameter declarations.

:mod:`core.config_common` declares each parameter once; here that declaration gives the
arguments of the family's instantiation macro and of its C++ ``Traits``: the common three
(D, the element type, causal), then every parameter declared ``traits=True`` in field order.
A parameter with its own ``macro`` picks that macro when set and is no macro argument; an
optional parameter is left off the end of the ``Traits`` arguments at its default (those
parameters are the template's last, defaulted ones, so other configs' aliases keep their
text).
"""

from __future__ import annotations

from collections.abc import Sequence

from codegen.cpp_text import cpp_bool
from core.config_common import FamilyConfigBase
from core.elements import element


def _cpp(value: object) -> str:
    return cpp_bool(value) if isinstance(value, bool) else str(value)


def cpp_args(config: FamilyConfigBase, *, traits: bool) -> list[str]:
    """The C++ template arguments of ``config``: the ``Traits``' (``traits``) or the
    instantiation macro's after the kernel name."""
    spec = config.spec
    params = [p for p in spec.params if p.traits and (traits or p.macro is None)]
    values = [getattr(config, p.name) for p in params]
    if traits:
        while params and params[-1].optional and values[-1] == spec.defaults[params[-1].name]:
            params.pop()
            values.pop()
    common = [str(config.d), element(config.dtype).cuda_type, cpp_bool(config.causal)]
    return common + [_cpp(v) for v in values]


def instantiation(config: FamilyConfigBase, include: str, macro: str) -> str:
    """The ``.cu`` text of one config: ``#include`` of the family's template and one macro
    line (``macro``, or the macro of the first set parameter that declares one)."""
    chosen = next(
        (p.macro for p in config.spec.params if p.macro and getattr(config, p.name)), macro
    )
    args = ", ".join([config.name, *cpp_args(config, traits=False)])
    return f'#include "{include}"\n{chosen}({args})\n'


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
