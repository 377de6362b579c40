"""The value syntax of ``fa2tune tune``'s options: lists, integers, choices, durations.

Lists are comma-separated; ``both`` in a dtype or mask list is every value; repeated values
count once, in the order first given. Durations are ``90``, ``90s``, ``10m``, ``1h30m``.
Every parser raises :class:`typer.BadParameter` naming the option, which typer turns into a
usage error with exit status 2; the messages are part of the command line's behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final, TypeVar

import typer

from core.config import DTYPES, HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.shape import MAX_DIM

_TRUE: Final = {"yes", "y", "true", "1", "causal", "on"}
_FALSE: Final = {"no", "n", "false", "0", "full", "off"}
#: In --dtype and --causal: every value (as the help says: "fp16, bf16 or both").
BOTH: Final = "both"
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s)?")
T = TypeVar("T")


def bad_option(option: str, message: str) -> typer.BadParameter:
    """The usage error of ``option`` (exit status 2), with ``message`` saying what is wrong."""
    return typer.BadParameter(message, param_hint=f"'{option}'")


def split_list(text: str, option: str) -> list[str]:
    """The items of a comma-separated list, stripped.

    Raises:
        typer.BadParameter: an empty list or an empty item.
    """
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise bad_option(option, f"expected a comma-separated list, got {text!r}")
    return items


def unique(items: Sequence[T]) -> list[T]:
    """``items`` without repeats, in the order first given."""
    return list(dict.fromkeys(items))


def parse_int_list(
    text: str,
    option: str,
    allowed: Sequence[int] | None = None,
    minimum: int = 1,
    maximum: int = MAX_DIM,
    allowed_text: str | None = None,
) -> list[int]:
    """Parse ``"64,128"``; every value must be an integer in ``minimum..maximum`` (by default
    the kernels' int32 range) and in ``allowed`` (``allowed_text``, when given, says what
    ``allowed`` is in the message instead of listing it).

    Raises:
        typer.BadParameter: on anything else (typer exits with status 2).
    """
    values = []
    for item in split_list(text, option):
        try:
            value = int(item)
        except ValueError:
            raise bad_option(option, f"{item!r} is not an integer") from None
        if value < minimum:
            raise bad_option(option, f"{value} is below {minimum}")
        if value > maximum:
            raise bad_option(option, f"{value} is above {maximum}")
        if allowed is not None and value not in allowed:
            what = allowed_text or f"one of {', '.join(map(str, allowed))}"
            raise bad_option(option, f"{value} is not {what}")
        values.append(value)
    return unique(values)


def parse_head_dims(text: str, option: str = "--d") -> list[int]:
    """Parse ``"40,128"``: supported head dims (:data:`core.config.HEAD_DIMS`)."""
    return parse_int_list(text, option, HEAD_DIMS, allowed_text=HEAD_DIMS_RULE)


def parse_kv_pages(text: str, option: str = "--kv-page") -> list[int]:
    """Parse ``"0,16"``: KV-cache layouts (:data:`core.problem.KV_PAGE_RULE`)."""
    from core.problem import KV_PAGE_RULE, MAX_KV_PAGE

    allowed = [0, *(1 << i for i in range(MAX_KV_PAGE.bit_length()))]
    return parse_int_list(text, option, allowed, minimum=0, maximum=MAX_KV_PAGE,
                          allowed_text=KV_PAGE_RULE)  # fmt: skip


def parse_kv_lengths(text: str, option: str = "--kv-lengths") -> list[str]:
    """Parse ``"mixed"``, ``"full,mixed"`` or ``"both"``: KV-cache length patterns
    (:data:`core.kv_lengths.KV_LENGTHS`)."""
    from core.kv_lengths import KV_LENGTHS

    return parse_choice_list(text, option, KV_LENGTHS, both=True)


def parse_choice_list(
    text: str, option: str, allowed: Sequence[str], *, both: bool = False
) -> list[str]:
    """Parse ``"fp16,bf16"`` against the allowed values (case-insensitive).

    Args:
        text: the option's value.
        option: the option's name, for messages.
        allowed: the values it may hold.
        both: also accept ``both``, standing for every allowed value in their order.

    Raises:
        typer.BadParameter: for a value not allowed.
    """
    values: list[str] = []
    for item in split_list(text, option):
        word = item.lower()
        if both and word == BOTH:
            values.extend(allowed)
        elif word in allowed:
            values.append(word)
        else:
            choices = f"{', '.join(allowed)} or {BOTH}" if both else ", ".join(allowed)
            raise bad_option(option, f"{item!r} is not one of {choices}")
    return unique(values)


def parse_dtypes(text: str, option: str = "--dtype") -> list[Dtype]:
    """Parse ``"fp16,bf16"`` or ``"both"`` into element types."""
    chosen = parse_choice_list(text, option, DTYPES, both=True)
    # The same values, typed as Dtype (parse_choice_list returns only allowed ones).
    return [next(dt for dt in DTYPES if dt == word) for word in chosen]


def parse_bool_list(text: str, option: str) -> list[bool]:
    """Parse ``"no,yes"`` (also true/false, 1/0, full/causal; ``both`` is no and yes) into
    booleans.

    Raises:
        typer.BadParameter: for anything else.
    """
    values: list[bool] = []
    for item in split_list(text, option):
        word = item.lower()
        if word == BOTH:
            values.extend((False, True))
        elif word in _TRUE:
            values.append(True)
        elif word in _FALSE:
            values.append(False)
        else:
            raise bad_option(option, f"{item!r} is not yes or no (or {BOTH})")
    return unique(values)


def parse_duration(text: str, option: str = "--time-budget") -> float:
    """Parse ``"600"``, ``"90s"``, ``"10m"``, ``"1h30m"`` or ``"1.5h"`` into seconds (> 0).

    Raises:
        typer.BadParameter: for anything else.
    """
    compact = text.strip().lower().replace(" ", "")
    pos, total, units = 0, 0.0, []
    while pos < len(compact):
        m = _DURATION_RE.match(compact, pos)
        if m is None:
            break
        unit = m[2] or ""
        total += float(m[1]) * {"h": 3600, "m": 60, "s": 1, "": 1}[unit]
        units.append(unit)
        pos = m.end()
    # A bare number means seconds, but only on its own ("1h 2" is ambiguous).
    ambiguous = "" in units and len(units) > 1
    if not compact or pos != len(compact) or len(set(units)) != len(units) or ambiguous:
        raise bad_option(option, f"{text!r} is not a duration (e.g. 600, 90s, 10m, 1h30m)")
    if total <= 0:
        raise bad_option(option, "the duration must be positive")
    return total


def parse_families(text: str | None) -> tuple[str, ...] | None:
    """``--family``: known kernel family names, in the registry's order; None when not given.

    Raises:
        typer.BadParameter: an unknown family.
    """
    if text is None:
        return None
    from codegen.families import FAMILIES

    names = split_list(text, "--family")
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise bad_option("--family", f"unknown {', '.join(unknown)} (known: {', '.join(FAMILIES)})")
    return tuple(f for f in FAMILIES if f in names)


def check_family_head_dims(ds: Iterable[int], families: Sequence[str] | None) -> None:
    """Refuse head dims none of the families named by ``--family`` has (with every family,
    fa2's head dims are all the supported ones; a family lacking a head dim is skipped there).

    Raises:
        typer.BadParameter: a head dim no named family has, naming the families' head dims.
    """
    if families is None:
        return
    from codegen.families import FAMILIES

    named = [FAMILIES[name] for name in families]
    for d in sorted(set(ds)):
        if not any(d in f.head_dims for f in named):
            names = ", ".join(f.name for f in named)
            who = names if len(named) == 1 else f"none of {names}"
            dims = "; ".join(f"{f.name}: {f.head_dims_text}" for f in named)
            raise bad_option("--family", f"{who} has no head dim {d} (head dims {dims})")
