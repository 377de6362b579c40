"""Brute-force attention over a KV cache's sequences, one (batch, head, row) at a time in
float64, written from FlashAttention's ``flash_attn_with_kvcache`` semantics: the CPU tests'
check of the op's torch path (which is in turn the GPU tests' reference)."""

from __future__ import annotations

import math
from typing import Any

from core.variant import Variant


def sees(i: int, j: int, nq: int, length: int, causal: bool, v: Variant) -> bool:
    """The rule for one (query, key) pair of a sequence with ``length`` keys, written out."""
    if j >= length:
        return False
    pos = i + length - nq
    if causal and j > pos:
        return False
    if v.window_right >= 0 and j > pos + v.window_right:
        return False
    if v.window_left >= 0 and j < pos - v.window_left:
        return False
    if v.chunk > 0:
        start = pos - pos % v.chunk  # Python's % rounds down, as the kernels' remainder
        if not start <= j < start + v.chunk:
            return False
    return True


def brute_attention(q: Any, keys: list[Any], values: list[Any], causal: bool, v: Variant,
                    sinks: Any, scale: float) -> tuple[Any, Any]:  # fmt: skip
    """O and LSE one (batch, head, row) at a time; ``keys[b]``: sequence b's keys [L, Hkv, D]
    (torch tensors; imports torch when called)."""
    import torch

    b_n, nq, hq, d = q.shape
    o = torch.zeros(b_n, nq, hq, d, dtype=torch.float64)
    lse = torch.full((b_n, hq, nq), float("-inf"), dtype=torch.float64)
    for b in range(b_n):
        k_b, v_b = keys[b].double(), values[b].double()
        length, hkv = int(k_b.shape[0]), int(k_b.shape[1])
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(nq):
                seen = [j for j in range(length) if sees(i, j, nq, length, causal, v)]
                logits = [float(q[b, i, h].double() @ k_b[j, kh]) * scale for j in seen]
                if v.softcap > 0:
                    logits = [v.softcap * math.tanh(s / v.softcap) for s in logits]
                extra = [float(sinks[h])] if sinks is not None else []
                if not logits and not extra:
                    continue
                m = max(logits + extra)
                total = sum(math.exp(s - m) for s in logits + extra)
                lse[b, h, i] = m + math.log(total)
                for s, j in zip(logits, seen, strict=True):
                    o[b, i, h] += math.exp(s - m) / total * v_b[j, kh]
    return o, lse
