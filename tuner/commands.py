"""CLI sub-commands of this stage (placeholders until the stage lands)."""

from __future__ import annotations

from fa2tune.unbuilt import not_built


def bench() -> None:
    """Not built yet."""
    not_built("bench")


def tune() -> None:
    """Not built yet."""
    not_built("tune")
