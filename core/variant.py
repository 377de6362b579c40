"""An attention variant: what a call asks of attention besides its shape and causality.

FlashAttention's semantics, bottom-right aligned like fa2tune's causal mask: with
``pos = i + nk - nq`` the key position of query row ``i``,

* ``window_left``, ``window_right`` (FlashAttention's ``window_size``): query ``i`` sees key
  ``j`` only if ``pos - window_left <= j <= pos + window_right``; -1 is no bound. Causal is the
  right bound 0: a causal call's ``window_right`` is 0 (:func:`normalize` makes it so).
* ``chunk`` (``attention_chunk``, Llama-4's chunked attention): > 0 keeps only the keys in
  ``pos``'s chunk, ``[pos - pos mod chunk, pos - pos mod chunk + chunk)`` (mod rounding down);
  0 is none. It combines with a window and causality (a key must pass all).
* ``softcap`` (Gemma-2's logit softcap): > 0 replaces each softmax-scaled score ``s`` by
  ``softcap * tanh(s / softcap)`` before the softmax; 0 is none.
* ``sinks`` (GPT-OSS's attention sinks): the call passes a learned logit per query head that
  joins every row's softmax denominator and attends to nothing (its value row is zero). The
  returned LSE is the log of the whole denominator, sink included; a row that sees no key then
  has O = 0 and LSE = its head's sink logit.

A kernel takes a variant through compile-time switches (:attr:`Variant.needs`: local masking,
softcap, sinks) and run-time values (window bounds, chunk, cap, the sink pointer): a config
built with a switch serves every value of it. The store keys a problem by the variant's
window, chunk and switches (:meth:`Variant.key_text`); the cap's value changes no cost, so
it is not part of the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.shape import effective_causal

#: The compile-time switches a kernel may be built with, as config parameter names.
SWITCHES: tuple[str, ...] = ("local", "softcap", "sinks")


class VariantError(ValueError):
    """A variant argument out of its domain (the message names the argument)."""


@dataclass(frozen=True)
class Variant:
    """A call's attention variant (the defaults: plain attention). Immutable; validated.

    Raises:
        VariantError: a window bound below -1, a chunk below 0, a softcap that is negative,
            not finite or not a number, ``sinks`` not a bool.
    """

    window_left: int = -1
    window_right: int = -1
    chunk: int = 0
    softcap: float = 0.0
    sinks: bool = False

    def __post_init__(self) -> None:
        for name in ("window_left", "window_right", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise VariantError(f"{name} must be an integer, got {value!r}")
        if self.window_left < -1 or self.window_right < -1:
            raise VariantError(
                f"window_size bounds must be >= 0, or -1 for none; got "
                f"({self.window_left}, {self.window_right})"
            )
        if self.chunk < 0:
            raise VariantError(f"attention_chunk must be > 0, or 0 for none; got {self.chunk}")
        cap = self.softcap
        if isinstance(cap, bool) or not isinstance(cap, int | float):
            raise VariantError(f"softcap must be a number, got {cap!r}")
        if not math.isfinite(cap) or cap < 0:
            raise VariantError(f"softcap must be finite and > 0, or 0 for none; got {cap!r}")
        object.__setattr__(self, "softcap", float(cap))
        if not isinstance(self.sinks, bool):
            raise VariantError(f"sinks must be a bool, got {self.sinks!r}")

    @property
    def local(self) -> bool:
        """Whether keys are masked by a window or a chunk (the local mask switch)."""
        return self.window_left >= 0 or self.window_right >= 0 or self.chunk > 0

    @property
    def needs(self) -> dict[str, bool]:
        """The compile-time switches a kernel needs for this variant, by config parameter."""
        return {"local": self.local, "softcap": self.softcap > 0, "sinks": self.sinks}

    @property
    def plain(self) -> bool:
        return not any(self.needs.values())

    def key_text(self) -> str:
        """The variant's part of a study name and of the store's key: ``""`` when plain,
        else ``_wl<left>_wr<right>``, ``_ch<chunk>``, ``_cap``, ``_snk`` as they apply."""
        parts = []
        if self.window_left >= 0 or self.window_right >= 0:
            parts.append(f"wl{self.window_left}_wr{self.window_right}")
        if self.chunk > 0:
            parts.append(f"ch{self.chunk}")
        if self.softcap > 0:
            parts.append("cap")
        if self.sinks:
            parts.append("snk")
        return "".join("_" + p for p in parts)

    def describe(self) -> str:
        """A few words for people (``plain`` when none applies)."""
        words = []
        if self.window_left >= 0 or self.window_right >= 0:
            words.append(f"window ({self.window_left}, {self.window_right})")
        if self.chunk > 0:
            words.append(f"chunk {self.chunk}")
        if self.softcap > 0:
            words.append(f"softcap {self.softcap:g}")
        if self.sinks:
            words.append("sinks")
        return ", ".join(words) or "plain"


PLAIN = Variant()


def normalize(
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    *,
    nq: int | None = None,
    nk: int | None = None,
    softcap: float = 0.0,
    sinks: bool = False,
) -> tuple[bool, Variant]:
    """A call's ``(causal, variant)`` in the one form the store and the kernels use.

    As FlashAttention does: a window ``(-1, 0)`` is causal, and so is any window whose right
    bound is 0 (``(L, 0)`` masks the keys causal ``(L, 0)`` does: one problem, not two); a
    causal call's right bound is 0
    (so the window then carries it: ``window_right`` 0 only with a left bound or a chunk, and
    causal alone stays the plain causal mask); given the lengths, a bound that reaches past
    every key is none (left >= nk - 1, right >= nq - 1), and so is a chunk that holds every key
    of a call whose queries all have a key position (nk >= nq and chunk >= nk).

    Raises:
        VariantError: as :class:`Variant`.
    """
    Variant(window_left, window_right, chunk, softcap, sinks)  # validates the raw arguments
    left, right = window_left, window_right
    if nk is not None and left >= nk - 1:
        left = -1
    if nq is not None and right >= nq - 1:
        right = -1
    if nq is not None and nk is not None and chunk >= nk and nk >= nq:
        chunk = 0
    if right == 0:
        causal = True  # a right bound 0 is causality, with or without a left bound
    if nq is not None and (left >= 0 or chunk > 0):
        # Decode is tuned and served unmasked; a plain, softcap or sinks call keeps its mask
        # as given (the lookups apply the same rule, and old clients' answers stay).
        causal = effective_causal(causal, nq)
    if causal:
        right = 0
    if causal and left < 0 and chunk == 0:
        right = -1  # plain causal: the causal switch says it, no window
    return causal, Variant(left, right, chunk, softcap, sinks)
