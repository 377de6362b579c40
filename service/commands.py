"""CLI sub-commands of this stage (placeholders until the stage lands)."""

from __future__ import annotations

from fa2tune.unbuilt import not_built


def serve() -> None:
    """Not built yet."""
    not_built("serve")


def export() -> None:
    """Not built yet."""
    not_built("export")
