"""CLI sub-commands of this stage (placeholders until the stage lands)."""

from __future__ import annotations

from fa2tune.unbuilt import not_built


def best() -> None:
    """Not built yet."""
    not_built("best")


def dump() -> None:
    """Not built yet."""
    not_built("dump")


def ingest() -> None:
    """Not built yet."""
    not_built("ingest")
