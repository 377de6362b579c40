"""``fa2tune.torch``: FlashAttention forward on the kernels tuned for this GPU, from PyTorch.

    from fa2tune.torch import attention, attention_varlen
    o = attention(q, k, v, causal=True)              # q [B, Nq, Hq, D], k/v [B, Nk, Hkv, D]
    o, lse = attention(q, k, v, return_lse=True, layout="bhnd")
    o = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)  # packed [total, H, D]
    o = attention(q, k, v, causal=True, window_size=(4096, 0), softcap=50.0, sinks=s)  # variants
    o = attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                               page_table=table, causal=True)  # KV cache, lengths on the GPU
    autotune("on_first_call", budget_s=30)       # tune untuned shapes in the background

Importing this module imports torch and registers ``torch.ops.fa2tune.attention``,
``torch.ops.fa2tune.attention_varlen`` and ``torch.ops.fa2tune.attention_with_kvcache``
(``torch.library`` custom ops with fake implementations: ``torch.compile(fullgraph=True)``
and CUDA-graph capture work). The base package never imports it, so fa2tune stays
installable without torch. See docs/torch.md for how a config is chosen and when a call
falls back to torch's own kernels.

The implementation lives in :mod:`fa2tune.ops`: both entries are one call path, a packed
batch being that path with its ``cu_seqlens``. This module is named like the torch package
but cannot shadow it: imports are absolute, so ``import torch`` inside fa2tune means the
real torch; only a script run from inside the ``fa2tune/`` directory (which puts that
directory first on ``sys.path``) would find this file as ``torch``, and that is refused below
with a clear error instead of a confusing one.
"""

from __future__ import annotations

if __name__ == "torch":  # pragma: no cover - only when fa2tune/ itself is on sys.path
    raise ImportError(
        "fa2tune/torch.py was imported as 'torch': do not run scripts from inside the "
        "fa2tune/ package directory (use `python -m fa2tune.cli` or the fa2tune command)"
    )

try:
    import torch as _torch  # noqa: F401  (the clear error below instead of one from deep inside)
except ImportError as _exc:  # pragma: no cover - exercised on machines without torch
    raise ImportError(
        "fa2tune.torch needs PyTorch (pip install 'fa2tune[gpu]'); the rest of fa2tune does not"
    ) from _exc

from fa2tune.ops import torch_op as _torch_op
from fa2tune.ops.autotune import AutoTuner, autotune
from fa2tune.ops.choice import FallbackWarning, Unsupported
from fa2tune.ops.kvcache import (
    attention_with_kvcache,
    attention_with_kvcache_op,
    clear_cache_decisions,
)
from fa2tune.ops.torch_op import (
    attention,
    attention_op,
    attention_varlen,
    attention_varlen_op,
)
from fa2tune.ops.workspace import free_workspaces


def clear_caches() -> None:
    """Forget every decision and warning of the entries (dense, packed and KV-cache calls)
    and the results read from the store; kernels stay loaded (see
    :func:`fa2tune.ops.torch_op.clear_caches`)."""
    _torch_op.clear_caches()
    clear_cache_decisions()


__all__ = [
    "AutoTuner",
    "FallbackWarning",
    "Unsupported",
    "attention",
    "attention_op",
    "attention_varlen",
    "attention_varlen_op",
    "attention_with_kvcache",
    "attention_with_kvcache_op",
    "autotune",
    "clear_caches",
    "free_workspaces",
]
