"""fa2tune: autotuning kernel generator and service for FlashAttention forward kernels."""

from __future__ import annotations

from core.version import __version__

__all__ = ["__version__"]
