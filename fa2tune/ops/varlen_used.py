"""Packed batches whose sequences use fewer rows than their offsets give (FlashAttention-3's
``seqused_q`` / ``seqused_k`` in ``flash_attn_varlen_func``), on the packed kernels.

Sequence ``b`` spans rows ``[cu[b], cu[b + 1])`` of the packed tensor but uses only the first
``used[b]`` of them (a serving engine's preallocated slots). The packed kernels read a
sequence's rows and length from the offsets alone, so the used rows are gathered into a
packed copy of the same row count whose offsets are ``cumsum(used)`` (its tail rows, past
the last used one, unread), the call runs on that, and its output rows go back to their
places (the unused query rows get zeros, an LSE of -inf). All index arithmetic on the
device: nothing is read on the host. Each of q, k, v costs one gathered copy.
"""

from __future__ import annotations

import torch


def _check_used(name: str, used: torch.Tensor, cu: torch.Tensor) -> None:
    if not isinstance(used, torch.Tensor) or used.dim() != 1 or used.dtype != torch.int32:
        raise ValueError(f"{name} must be a 1-d int32 tensor, got "
                         f"{getattr(used, 'dtype', type(used).__name__)}")  # fmt: skip
    if int(used.shape[0]) != int(cu.shape[0]) - 1:
        raise ValueError(f"{name} has {used.shape[0]} entries for {int(cu.shape[0]) - 1} "
                         "sequences")  # fmt: skip
    if used.device != cu.device:
        raise ValueError(f"{name} is on {used.device}, its offsets on {cu.device}")


def sequence_of(cu: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each packed row ``t < total``: its sequence ``b`` (a row past ``cu[-1]`` counts as
    the last sequence's) and its offset ``t - cu[b]`` in it (int64, on the device)."""
    cul = cu.long()
    t = torch.arange(total, device=cul.device)
    seq = torch.searchsorted(cul[1:], t, right=True).clamp(max=int(cul.shape[0]) - 2)
    return seq, t - cul[seq]


def used_offsets(cu: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """The offsets of the compacted copy: ``[0, cumsum(min(used, cu[b+1] - cu[b]))]`` (int32)
    (a used count past its sequence's span is clamped to it)."""
    span = cu[1:].long() - cu[:-1].long()
    counts = torch.minimum(used.long().clamp(min=0), span)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(torch.int32)


def _source_rows(cu: torch.Tensor, packed_cu: torch.Tensor, total: int) -> torch.Tensor:
    """For each row ``r`` of the compacted copy: the row of the original it comes from (rows
    past the last used one map to row 0; they are never read)."""
    seq, offset = sequence_of(packed_cu, total)
    src = cu.long()[seq] + offset
    return torch.where(offset < packed_cu.long()[seq + 1] - packed_cu.long()[seq], src, 0)


def compact(
    x: torch.Tensor, cu: torch.Tensor, used: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[total, H, D]`` with each sequence's used rows moved to the front of a packed
    copy (same row count), and the copy's offsets."""
    packed_cu = used_offsets(cu, used)
    return x.index_select(0, _source_rows(cu, packed_cu, int(x.shape[0]))), packed_cu


def expand(
    o: torch.Tensor,
    lse: torch.Tensor | None,
    cu: torch.Tensor,
    packed_cu: torch.Tensor,
    empty_lse: float = float("-inf"),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The compacted call's ``o`` ``[total, Hq, D]`` and LSE ``[Hq, total]`` back in the
    original rows: a used row from its compacted place, an unused one zeros (O) and
    ``empty_lse`` (the caller's value for a row that sees no key)."""
    seq, offset = sequence_of(cu, int(o.shape[0]))
    kept = offset < (packed_cu.long()[seq + 1] - packed_cu.long()[seq])
    src = torch.where(kept, packed_cu.long()[seq] + offset, torch.zeros_like(offset))
    out = torch.where(kept.view(-1, 1, 1), o.index_select(0, src), o.new_zeros(()))
    if lse is None:
        return out, None
    full = torch.where(kept.view(1, -1), lse.index_select(1, src), lse.new_full((), empty_lse))
    return out, full


def check_used(
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
) -> None:
    """Shape, dtype and device checks of the used counts (their values stay on the device).

    Raises:
        ValueError: naming the argument.
    """
    if seqused_q is not None:
        _check_used("seqused_q", seqused_q, cu_seqlens_q)
    if seqused_k is not None:
        _check_used("seqused_k", seqused_k, cu_seqlens_k)


__all__ = ["check_used", "compact", "expand", "used_offsets"]
