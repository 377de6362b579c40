"""fa2tune as a transformers attention implementation: ``attn_implementation="fa2tune"``.

    import fa2tune.integrations.transformers as fa2tune_hf
    fa2tune_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa2tune")

:func:`register` adds an attention function to transformers' ``AttentionInterface`` and, under
the same name, FlashAttention-2's mask function to its ``AttentionMaskInterface``: a layer is
then given no mask (every token valid) or the batch's 2-D padding mask ``[B, Nk]``, never a
4-D one, and the function knows the rest (causal, the sliding window, softcap, sinks) from
the layer's arguments, as transformers' own FlashAttention path does.

* No padding: one :func:`fa2tune.torch.attention` call on the ``[B, H, N, D]`` tensors
  transformers passes (``layout="bhnd"``, GQA as it comes, the layer's scale), causal
  bottom-right for prefill and decode alike, ``sliding_window`` W as window ``(W - 1, 0)``,
  ``softcap``, and ``s_aux`` as attention sinks (GPT-OSS).
* Padding: the valid rows are gathered into a packed batch and run by
  :func:`fa2tune.torch.attention_varlen`, then scattered back (padded query rows get zeros).
  The offsets come from the padding mask once per forward pass, not per layer: every layer
  of a pass gets the same mask tensor, and its unpadding is kept for that tensor.
* Anything fa2tune does not run (dropout while training, attention weights asked for, a
  4-D mask from a caller that built its own) goes to transformers' SDPA path, with one
  warning per reason and a count in :data:`FALLBACKS`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from fa2tune.torch import attention, attention_varlen

log = logging.getLogger(__name__)

NAME = "fa2tune"
#: Calls sent to transformers' SDPA path, by reason (what fa2tune did not run).
FALLBACKS: Counter[str] = Counter()
_warned: set[str] = set()
_lock = threading.Lock()


def register(name: str = NAME) -> str:
    """Register fa2tune with transformers under ``name`` (idempotent); returns the name to
    pass as ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def _fallback(reason: str, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with _lock:
        FALLBACKS[reason] += 1
        first = reason not in _warned
        _warned.add(reason)
    if first:
        log.warning("fa2tune attention: %s; those calls run transformers' SDPA path", reason)
    out: tuple[torch.Tensor, None] = sdpa_attention_forward(*args, **kwargs)
    return out


@dataclass(frozen=True)
class _Unpadded:
    """A padding mask's packed layout: the flat indices of valid key and query rows in
    ``[B * N]`` order, per-sequence offsets and longest lengths."""

    k_index: torch.Tensor
    q_index: torch.Tensor
    cu_k: torch.Tensor
    cu_q: torch.Tensor
    max_k: int
    max_q: int


_unpadded: dict[tuple[int, int, int, int], tuple[torch.Tensor, _Unpadded]] = {}


def _unpad(mask: torch.Tensor, nq: int, nk: int) -> _Unpadded:
    """The packed layout of a 2-D padding mask ``[B, M]`` (True or 1: a valid token) over
    ``nk`` keys (``M < nk`` for a static cache: its first ``M`` slots hold the tokens) and
    ``nq`` queries (the mask's last ``nq`` positions); kept per mask tensor, so the one host
    read of the longest lengths happens once per forward pass rather than once per layer."""
    key = (id(mask), mask._version, nq, nk)
    hit = _unpadded.get(key)
    if hit is not None and hit[0] is mask:
        return hit[1]
    q_valid = mask[:, -nq:].bool()
    valid = torch.nn.functional.pad(mask.bool(), (0, nk - mask.shape[1]), value=False)
    k_len = valid.sum(dim=1, dtype=torch.int32)
    q_len = q_valid.sum(dim=1, dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32, device=mask.device)
    cu_k = torch.cat([zero, torch.cumsum(k_len, 0, dtype=torch.int32)])
    cu_q = torch.cat([zero, torch.cumsum(q_len, 0, dtype=torch.int32)])
    longest = torch.stack([k_len.max(), q_len.max()]).tolist()  # the one host read
    found = _Unpadded(
        k_index=torch.nonzero(valid.flatten(), as_tuple=True)[0],
        q_index=torch.nonzero(q_valid.flatten(), as_tuple=True)[0],
        cu_k=cu_k,
        cu_q=cu_q,
        max_k=int(longest[0]),
        max_q=int(longest[1]),
    )
    _unpadded.clear()  # one mask in use at a time: the pass's
    _unpadded[key] = (mask, found)
    return found


def _variant_args(module: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    window = kwargs.get("sliding_window")
    if window:
        out["window_size"] = (int(window) - 1, 0)  # W keys: the token and W - 1 before it
    softcap = kwargs.get("softcap")
    if softcap:
        out["softcap"] = float(softcap)
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        out["sinks"] = sinks
    return out


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[B, Hq, Nq, D]``, ``key`` and
    ``value`` ``[B, Hkv, Nk, D]``; returns ``([B, Nq, Hq, D], None)``."""
    why = (
        "dropout while training" if dropout > 0.0 and module.training
        else "attention weights asked for" if kwargs.get("output_attentions")
        else "a 4-D attention mask" if attention_mask is not None and attention_mask.dim() != 2
        else None
    )  # fmt: skip
    if why is not None:
        return _fallback(why, module, query, key, value, attention_mask, dropout=dropout,
                         scaling=scaling, is_causal=is_causal, **kwargs)  # fmt: skip
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    variant = _variant_args(module, kwargs)
    if attention_mask is None:
        out = attention(query, key, value, causal=causal, scale=scaling, layout="bhnd", **variant)
        assert isinstance(out, torch.Tensor)
        return out.transpose(1, 2).contiguous(), None
    b, hq, nq, d = query.shape
    hk, nk = key.shape[1], key.shape[2]
    packed = _unpad(attention_mask[:, -nk:], nq, nk)
    q = query.transpose(1, 2).reshape(b * nq, hq, d).index_select(0, packed.q_index)
    k = key.transpose(1, 2).reshape(b * nk, hk, d).index_select(0, packed.k_index)
    v = value.transpose(1, 2).reshape(b * nk, hk, d).index_select(0, packed.k_index)
    o = attention_varlen(q, k, v, packed.cu_q, packed.cu_k, packed.max_q, packed.max_k,
                         causal=causal, scale=scaling, **variant)  # fmt: skip
    assert isinstance(o, torch.Tensor)
    full = o.new_zeros(b * nq, hq, d)
    full.index_copy_(0, packed.q_index, o)
    return full.view(b, nq, hq, d), None
