"""fa2tune: autotuning kernel generator and service for FlashAttention-2 forward kernels."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
