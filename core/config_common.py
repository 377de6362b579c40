"""What every family's config type shares: the key derived from a name and integer parsing.

Each family's config (:mod:`core.config`, :mod:`core.fa3_config`, :mod:`core.splitkv_config`)
is a frozen dataclass whose name spells every parameter; the helpers here keep the rules that
must not drift between families in one place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


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
