"""What every family's config type shares: one declaration per parameter, and what it derives.

A family's config is a frozen dataclass whose family parameters are declared once, each with
:func:`param`: the token it writes into the config's name (``br{}`` for an integer, ``ov``
for a flag, ``rs|ss`` for a boolean choice), whether it is a C++ ``Traits`` argument (and
whether being set selects another instantiation macro), its search (optuna) name and how a
config's value is encoded there, and whether it is *optional*: added after results were
stored, so left out of :meth:`FamilyConfigBase.params` at its default. The class decorator
:func:`family_config` reads the declarations and the base class :class:`FamilyConfigBase`
derives from them the name, the name's parser (a regex built from the tokens), the dict form,
the stored parameters and the search parameters; :mod:`codegen.families.declared` derives the
render and traits arguments. The common fields ``d``, ``dtype`` and ``causal`` come first in
every config and are written ``<family>_d<d>_<dtype>_<causal|full>`` in front of the tokens.

Contract: the derived forms are exactly those each family wrote by hand before (names, keys,
stored parameters, optuna names and choice encodings of stored studies and shipped results;
tests/families/test_declarations.py checks them against a fixture of the old code).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

from core.config import Dtype

#: Field names every family's config starts with.
COMMON_FIELDS: tuple[str, ...] = ("d", "dtype", "causal")
#: The key of a field's :class:`ParamSpec` in its dataclass metadata.
_META = "fa2tune.param"

SearchValue = str | int | bool


def name_key(name: str) -> str:
    """A config's stable 16-hex-digit key: the start of the SHA-256 of its name."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def int_value(data: Mapping[str, object], key: str) -> int:
    """``data[key]`` as an integer (an int or its decimal text, as stored or parsed).

    Raises:
        KeyError: ``key`` is missing.
        TypeError: the value is neither an int nor a string.
        ValueError: a string that is not an integer.
    """
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{key}: expected an integer, got {value!r}")
    return int(value)


def _loose_int(data: Mapping[str, object], key: str) -> int:
    return int(data[key])  # type: ignore[call-overload, no-any-return]


@dataclass(frozen=True)
class ParamSpec:
    """One family parameter's declaration (see :func:`param`); ``name`` is its field's."""

    token: str
    optional: bool = False
    missing_ok: bool = False
    suffix: bool = False
    instead_of: str | None = None
    traits: bool = True
    macro: str | None = None
    search: str | None = None
    search_as: tuple[str, str] | Callable[[Any], SearchValue] | None = None
    search_order: tuple[str, ...] | None = None
    variant: bool = False
    cache: bool = False
    name: str = ""

    @property
    def kind(self) -> str:
        """``int`` (token with ``{}``), ``choice`` (``a|b``: True is a) or ``flag``."""
        if "{}" in self.token:
            return "int"
        return "choice" if "|" in self.token else "flag"

    def text(self, value: object) -> str | None:
        """The name segment of ``value`` (without its ``_``); None for an unset flag."""
        if self.kind == "int":
            return self.token.format(value)
        if self.kind == "choice":
            yes, no = self.token.split("|")
            return yes if value else no
        return self.token if value else None

    def pattern(self) -> str:
        """The regex of the segment, with a named group holding the value."""
        if self.kind == "int":
            head, _, tail = self.token.partition("{}")
            return f"{re.escape(head)}(?P<{self.name}>\\d+){re.escape(tail)}"
        words = self.token.split("|") if self.kind == "choice" else [self.token]
        return f"(?P<{self.name}>{'|'.join(map(re.escape, words))})"

    def parse(self, group: str | None) -> object:
        """The value of a matched segment (None: the segment was absent)."""
        if self.kind == "int":
            return None if group is None else int(group)
        if self.kind == "choice":
            return group == self.token.split("|")[0]
        return group is not None

    def search_value(self, config: object) -> SearchValue:
        """The optuna parameter value of ``config`` for this parameter."""
        value = getattr(config, self.name)
        if callable(self.search_as):
            return self.search_as(config)
        if isinstance(self.search_as, tuple):
            return self.search_as[0] if value else self.search_as[1]
        if self.kind == "choice":
            return self.text(value) or ""
        return value  # type: ignore[no-any-return]


def param(
    token: str,
    *,
    default: Any = MISSING,
    optional: bool = False,
    missing_ok: bool = False,
    suffix: bool = False,
    instead_of: str | None = None,
    traits: bool = True,
    macro: str | None = None,
    search: str | None = None,
    search_as: tuple[str, str] | Callable[[Any], SearchValue] | None = None,
    search_order: tuple[str, ...] | None = None,
    variant: bool = False,
    cache: bool = False,
) -> Any:
    """Declare one family parameter as a dataclass field.

    Args:
        token: its name segment: ``"br{}"`` (integer), ``"ov"`` (flag, absent when false) or
            ``"rs|ss"`` (boolean written as one of two words, true first).
        default: the field's default.
        optional: added after results were stored: left out of ``params()`` at its
            default, and a dict without it takes the default (stored rows stay the same).
        missing_ok: a dict without it takes the default (it is still stored).
        suffix: its segment goes after every other parameter's (a mode such as ``_vl``).
        instead_of: a flag whose segment, when set, stands in place of that parameter's
            (``swz`` instead of ``pad<N>``); that parameter then reads its default.
        traits: the parameter is an argument of the C++ ``Traits`` (in field order); an
            optional one is left off the end at its default.
        macro: set, the instantiation file uses this macro instead of the family's (and the
            parameter is no argument of the macro).
        search: its optuna parameter name; None when the search does not draw it.
        search_as: how a config's value is encoded there: two words for true and false, or a
            function of the config (a derived parameter); default: the value (a choice: its
            word).
        search_order: the order of the choice values in a study (default: sorted).
        variant: an attention variant's compile-time switch (:func:`variant_switch`).
        cache: part of a KV-cache kernel's layout (:func:`cache_params`): left out of the
            name, the dict form and the C++ arguments of every config at its default.
    """
    spec = ParamSpec(
        token=token, optional=optional, missing_ok=missing_ok, suffix=suffix,
        instead_of=instead_of, traits=traits, macro=macro, search=search,
        search_as=search_as, search_order=search_order, variant=variant, cache=cache,
    )  # fmt: skip
    return field(default=default, metadata={_META: spec})


#: The name token of each variant switch (:data:`core.variant.SWITCHES`), in field order.
VARIANT_TOKENS: dict[str, str] = {"local": "loc", "softcap": "cap", "sinks": "snk"}


def variant_switch(name: str) -> Any:
    """Declare one attention-variant switch (``local``, ``softcap``, ``sinks``) of a family
    config: an optional flag written at the end of the name (``_loc``, ``_cap``, ``_snk``),
    the ``Traits``' last arguments, not searched (the problem decides it). A config with one
    set is instantiated with its family's variant macro, and its kernel takes ``FaVariant``
    as its last argument (:mod:`codegen.families.declared`)."""
    return param(VARIANT_TOKENS[name], default=False, optional=True, suffix=True, variant=True)


def kvcache_switch() -> Any:
    """Declare a family config's KV-cache switch: ``_kvc`` at the end of the name, set for a
    kernel that reads K and V from a cache with each sequence's length on the device (its
    kernel takes ``FaVariant`` and ``FaKvCache`` last; the problem decides it, the search never
    draws it). Not a ``Traits`` argument: the cache macro names ``CacheTraits`` itself."""
    return param("kvc", default=False, optional=True, suffix=True, traits=False, cache=True)


def page_size_param() -> Any:
    """Declare a cache kernel's page size: ``_pg<P>`` after ``_kvc`` for a paged cache, a
    power of two; 0 (a contiguous cache, and every config without a cache) is not written."""
    return param("pg{}", default=0, optional=True, suffix=True, cache=True)


@dataclass(frozen=True)
class ConfigSpec:
    """A family config type's declarations, in field order, and what is derived once."""

    family: str
    example: str
    params: tuple[ParamSpec, ...]
    defaults: Mapping[str, object]
    name_re: re.Pattern[str]
    strict_ints: bool
    flat_params: bool = False

    @property
    def optional(self) -> frozenset[str]:
        return frozenset(p.name for p in self.params if p.optional)

    @property
    def search_names(self) -> tuple[str, ...]:
        """The optuna parameter names, in the order a trial draws them."""
        return tuple(p.search for p in self.params if p.search is not None)

    @property
    def added_search_defaults(self) -> dict[str, SearchValue]:
        """Search parameters of optional parameters, with the encoding of their default (what
        every config had before the parameter was added)."""
        out: dict[str, SearchValue] = {}
        for p in self.params:
            if p.optional and p.search is not None and isinstance(p.search_as, tuple):
                out[p.search] = p.search_as[0] if self.defaults[p.name] else p.search_as[1]
        return out

    def name_order(self) -> list[ParamSpec]:
        """The parameters whose segments the name writes, in the order it writes them."""
        written = [p for p in self.params if p.instead_of is None]
        return [p for p in written if not p.suffix] + [p for p in written if p.suffix]


def _segment_pattern(spec: ConfigSpec, p: ParamSpec) -> str:
    alt = [q for q in spec.params if q.instead_of == p.name]
    body = p.pattern()
    if alt:
        body = "(?:" + "|".join([body, *(q.pattern() for q in alt)]) + ")"
        return "_" + body
    return f"(?:_{body})?" if p.kind == "flag" or p.cache else "_" + body


def _build_spec(
    cls: type, family: str, example: str, strict_ints: bool, flat_params: bool
) -> ConfigSpec:
    specs: list[ParamSpec] = []
    defaults: dict[str, object] = {}
    for f in fields(cls):
        if f.name in COMMON_FIELDS:
            continue
        spec = f.metadata.get(_META)
        if not isinstance(spec, ParamSpec):
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with param()")
        specs.append(replace(spec, name=f.name))
        if f.default is not MISSING:
            defaults[f.name] = f.default
    head = rf"^{re.escape(family)}_d(?P<d>\d+)_(?P<dtype>fp16|bf16)_(?P<causal>causal|full)"
    partial = ConfigSpec(family, example, tuple(specs), defaults, re.compile(head), strict_ints)
    body = "".join(_segment_pattern(partial, p) for p in partial.name_order())
    name_re = re.compile(head + body + "$")
    return ConfigSpec(family, example, tuple(specs), defaults, name_re, strict_ints, flat_params)


C = TypeVar("C", bound="FamilyConfigBase")


def family_config(
    family: str, *, example: str, strict_ints: bool = True, flat_params: bool = False
) -> Callable[[type[C]], type[C]]:
    """Class decorator (over ``@dataclass(frozen=True, order=True)``) that makes a family's
    config type from its :func:`param` declarations.

    Args:
        family: the family's name, also its config names' prefix.
        example: a config name quoted in parse errors.
        strict_ints: dict values must be ints or their decimal text (:func:`int_value`);
            False keeps the older, looser ``int()`` of the first family's dict form.
        flat_params: answers (``/v1/best``) also list the parameters as top-level fields,
            as they did for the first family before there were others.
    """

    def deco(cls: type[C]) -> type[C]:
        spec = _build_spec(cls, family, example, strict_ints, flat_params)
        cls.family = family
        cls.spec = spec
        cls.optional_params = spec.optional
        return cls

    return deco


@dataclass(frozen=True, order=True)
class FamilyConfigBase:
    """Every family's config: the common fields, and what is derived from the declarations
    of the family's own (a frozen, ordered dataclass that adds them after these three).

    Attributes:
        d: head dimension.
        dtype: element type of Q, K, V and O.
        causal: bottom-right aligned causal mask.
    """

    family: ClassVar[str]
    spec: ClassVar[ConfigSpec]
    #: Parameters :meth:`params` leaves out at their default (see :func:`param`).
    optional_params: ClassVar[frozenset[str]]

    d: int
    dtype: Dtype
    causal: bool

    @property
    def name(self) -> str:
        """Readable identifier, also the kernel's extern "C" symbol."""
        mask = "causal" if self.causal else "full"
        parts = [f"{self.family}_d{self.d}_{self.dtype}_{mask}"]
        for p in self.spec.name_order():
            alt = [q for q in self.spec.params if q.instead_of == p.name]
            text = next((q.text(True) for q in alt if getattr(self, q.name)), None)
            if p.cache and getattr(self, p.name) == self.spec.defaults[p.name]:
                continue  # a cache parameter at its default is not written
            text = text or p.text(getattr(self, p.name))
            if text is not None:
                parts.append(text)
        return "_".join(parts)

    @property
    def key(self) -> str:
        """Stable 16-hex-digit key derived from the name."""
        return name_key(self.name)

    def to_dict(self) -> dict[str, object]:
        """Every field, but the variant switches only when set and the cache parameters only
        off their defaults (the dict forms of configs stored before them stay what they
        were)."""
        out = asdict(self)
        for p in self.spec.params:
            if (p.variant and not out[p.name]) or (
                p.cache and out[p.name] == self.spec.defaults[p.name]
            ):
                del out[p.name]
        return out

    @property
    def variant_switches(self) -> dict[str, bool]:
        """The config's attention-variant switches by name (empty for a family without)."""
        return {p.name: bool(getattr(self, p.name)) for p in self.spec.params if p.variant}

    @property
    def has_cache(self) -> bool:
        """Whether the config is a KV-cache kernel (a cache parameter off its default: its
        kernel takes ``FaVariant`` and ``FaKvCache`` last)."""
        return any(
            getattr(self, p.name) != self.spec.defaults[p.name] for p in self.spec.params if p.cache
        )

    @property
    def has_variant(self) -> bool:
        """Whether the config is built with a variant switch (its kernel takes FaVariant)."""
        return any(self.variant_switches.values())

    def params(self) -> dict[str, Any]:
        """The family's own parameters: every field but ``d``, ``dtype`` and ``causal``
        (an optional one only when it differs from its default)."""
        own = {p.name: getattr(self, p.name) for p in self.spec.params}
        for name in self.optional_params:
            if own[name] == self.spec.defaults[name]:
                del own[name]
        return own

    def search_params(self) -> dict[str, SearchValue]:
        """The optuna parameters that pick this config among its family's of its group."""
        return {p.search: p.search_value(self) for p in self.spec.params if p.search}

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, object]) -> C:
        """The config of a dict form (:meth:`to_dict`, or the store's columns and params).

        Raises:
            KeyError: a parameter is missing (optional ones take their default).
            TypeError, ValueError: a value is not an integer where one is needed.
        """
        num = int_value if cls.spec.strict_ints else _loose_int
        values: dict[str, object] = {
            "d": num(data, "d"), "dtype": str(data["dtype"]), "causal": bool(data["causal"]),
        }  # fmt: skip
        for p in cls.spec.params:
            if p.name not in data and (p.optional or p.missing_ok):
                values[p.name] = cls.spec.defaults[p.name]
            elif p.kind == "int":
                values[p.name] = num(data, p.name)
            else:
                values[p.name] = bool(data[p.name])
        return cls(**values)  # type: ignore[arg-type]  # typed by the declarations

    @classmethod
    def from_name(cls: type[C], name: str) -> C:
        """Parse a name produced by :attr:`name`.

        Raises:
            ValueError: when ``name`` is not a config name of this family.
        """
        m = cls.spec.name_re.match(name)
        if m is None:
            raise ValueError(
                f"not a kernel config name: {name!r} (expected e.g. {cls.spec.example})"
            )
        values: dict[str, object] = {
            "d": int(m["d"]), "dtype": m["dtype"], "causal": m["causal"] == "causal",
        }  # fmt: skip
        for p in cls.spec.params:
            value = p.parse(m[p.name])
            values[p.name] = cls.spec.defaults[p.name] if value is None else value
        return cls(**values)  # type: ignore[arg-type]  # typed by the declarations
