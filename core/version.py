"""The product's version, on the ground floor so every stage can stamp it without importing
the ``fa2tune`` package (the CLI and the torch op sit above every stage)."""

from __future__ import annotations

__version__ = "0.1.0"
