"""CLI sub-commands of this stage (placeholders until the stage lands)."""

from __future__ import annotations

from fa2tune.unbuilt import not_built


def space() -> None:
    """Not built yet."""
    not_built("space")


def build() -> None:
    """Not built yet."""
    not_built("build")
