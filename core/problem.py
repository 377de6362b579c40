"""A tuning problem: the shape and type of attention a config is tuned for, on one GPU.

Part of the shared floor (:mod:`core`): every stage reads problems, none owns them. The
throughput formula lives here once (:meth:`Problem.tflops`), so the worker, the search, the
replay and the store count TFLOP/s the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any

from core.config import Dtype
from core.kv_lengths import check_kv_lengths, kv_lengths_text, pattern_lengths
from core.variant import PLAIN, Variant

#: The variant's fields in a problem's dict form (present only when the variant is not plain).
VARIANT_FIELDS: tuple[str, ...] = ("window_left", "window_right", "chunk", "softcap", "sinks")

#: The largest page size of a paged KV cache (the split-KV cache kernels' domain: every power
#: of two up to it; FlashAttention-3 and FlashInfer take any, vLLM's default is 16).
MAX_KV_PAGE = 4096
#: What a problem's (or a request's) ``kv_page`` may be, for messages.
KV_PAGE_RULE = (
    f"0 (a contiguous KV cache) or a power of two from 1 to {MAX_KV_PAGE} (a paged cache's "
    "page size)"
)


def kv_page_error(page: object) -> str | None:
    """Why ``page`` is not a KV-cache layout (:data:`KV_PAGE_RULE`); None when it is one."""
    if isinstance(page, bool) or not isinstance(page, int):
        return f"kv_page must be an integer ({KV_PAGE_RULE}), got {page!r}"
    if page < 0 or page > MAX_KV_PAGE or page & (page - 1):
        return f"kv_page must be {KV_PAGE_RULE}, got {page}"
    return None


def kv_page_text(page: int | None) -> str:
    """The layout's part of a study name: ``""`` for a dense problem, ``_kvc`` for a
    contiguous cache, ``_kvc_pg<P>`` for a paged one (as the cache kernels' config names)."""
    if page is None:
        return ""
    return "_kvc" if page == 0 else f"_kvc_pg{page}"


def describe_kv_page(page: int | None) -> str:
    """A KV-cache layout in words: ``no KV cache``, ``a contiguous KV cache``, ``a paged KV
    cache of 16-token pages``."""
    if page is None:
        return "no KV cache"
    return "a contiguous KV cache" if page == 0 else f"a paged KV cache of {page}-token pages"


def kv_page_of(config: object) -> int | None:
    """The KV-cache layout a config's kernel reads (None: not a cache kernel; 0: contiguous;
    P: pages of P tokens), from its ``kvcache`` and ``page`` parameters (a family without
    them has no cache kernels)."""
    if not getattr(config, "kvcache", False):
        return None
    return int(getattr(config, "page", 0))


@dataclass(frozen=True)
class Problem:
    """One (GPU, D, N, batch, heads, dtype, causal) point of a campaign.

    ``n`` is both the query and the key length (the campaign's square problems);
    ``nk`` overrides the key length for Nq != Nk. ``kv_heads`` defaults to ``heads``.

    ``seqlens`` makes it a packed variable-length batch (self-attention: each sequence's query
    and key lengths are equal): ``batch`` is then the number of sequences and ``n`` the
    longest, both derived from it (pass ``seqlens`` alone via :meth:`varlen`).

    ``variant`` is the attention variant (:mod:`core.variant`: window, chunk, softcap,
    sinks); plain by default. It is part of what is tuned (a window changes what is fast) and
    of the study name; the dict form writes its fields flat (``window_left``, ...) and only
    when it is not plain, so the forms of problems stored before variants stay the same.

    ``kv_page`` makes it a KV-cache problem, timed on the split-KV family's cache kernels
    (docs/splitkv_kernel.md, "KV caches"): 0 a contiguous cache read with each sequence's
    length on the device (the ``_kvc`` kernels), P (a power of two) a paged cache of P-token
    pages (``_kvc_pg<P>``); None (the default) an ordinary dense problem. ``n`` is then the
    query rows per step (Nq) and ``nk`` the keys each sequence holds when timed. The layout
    changes what is fast, so it is part of the study name (``_kvc``, ``_kvc_pg16``) and of the
    dict form, both only when it is set (dense problems keep their forms).

    ``kv_lengths`` is a cache problem's length pattern (:mod:`core.kv_lengths`): ``full``
    (every sequence holds ``nk`` keys, the default) or ``mixed`` (a fixed spread up to
    ``nk``, as a serving batch has); ``mixed`` is in the study name (``_mix``) and the dict
    form, ``full`` in neither (cache problems stored before it keep their forms).

    Raises:
        ValueError: a varlen problem whose ``n``/``batch`` disagree with ``seqlens``, or with
            ``nk`` set, or a length below 1; a ``variant`` that is not a :class:`Variant`; a
            ``kv_page`` that is not :data:`KV_PAGE_RULE`, or given with ``seqlens``; a
            ``kv_lengths`` that is not a pattern, or ``mixed`` without ``kv_page``.
    """

    gpu: str
    d: int
    n: int
    batch: int = 2
    heads: int = 16
    dtype: Dtype = "fp16"
    causal: bool = False
    kv_heads: int | None = None
    nk: int | None = None
    seqlens: tuple[int, ...] | None = None
    variant: Variant = PLAIN
    kv_page: int | None = None
    kv_lengths: str = "full"

    def __post_init__(self) -> None:
        if not isinstance(self.variant, Variant):
            raise ValueError(f"variant must be a core.variant.Variant, got {self.variant!r}")
        check_kv_lengths(self.kv_lengths, self.kv_page)
        if self.kv_page is not None:
            why = kv_page_error(self.kv_page)
            if why is not None:
                raise ValueError(why)
            if self.seqlens is not None:
                raise ValueError(
                    "a KV-cache problem (kv_page) is a dense batch of sequences with lengths "
                    "on the device; it takes no seqlens (a packed varlen batch)"
                )
        if self.seqlens is None:
            return
        lens = tuple(int(x) for x in self.seqlens)
        object.__setattr__(self, "seqlens", lens)
        if not lens or min(lens) < 1:
            raise ValueError(f"seqlens must be one or more lengths >= 1, got {list(lens)}")
        if self.n != max(lens) or self.batch != len(lens) or self.nk is not None:
            raise ValueError(
                f"a varlen problem has n = the longest of seqlens ({max(lens)}), batch = their "
                f"count ({len(lens)}) and no nk; got n={self.n}, batch={self.batch}, nk={self.nk}"
            )

    @classmethod
    def varlen(cls, gpu: str, d: int, seqlens: tuple[int, ...], **kwargs: Any) -> Problem:
        """A packed variable-length problem over ``seqlens`` (``n`` and ``batch`` derived)."""
        lens = tuple(int(x) for x in seqlens)
        return cls(gpu=gpu, d=d, n=max(lens, default=0), batch=len(lens), seqlens=lens, **kwargs)

    @property
    def is_varlen(self) -> bool:
        return self.seqlens is not None

    @property
    def is_cache(self) -> bool:
        """Whether it is a KV-cache problem (:attr:`kv_page` set)."""
        return self.kv_page is not None

    @property
    def cache_lengths(self) -> tuple[int, ...] | None:
        """A cache problem's length per sequence (:func:`core.kv_lengths.pattern_lengths`);
        None for a dense or packed problem."""
        if self.kv_page is None:
            return None
        return pattern_lengths(self.kv_lengths, self.batch, self.n_keys)

    @property
    def n_keys(self) -> int:
        return self.nk if self.nk is not None else self.n

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def flops(self) -> float:
        """Forward FLOPs counted the standard way: 4·B·H·Nq·Nk·D, halved for causal (summed
        over the sequences of a varlen problem).

        A cache problem of ``mixed`` lengths counts each sequence's own keys.

        A windowed or chunked problem (``variant.local``) counts 4·B·H·D per (row, key) pair
        a row sees instead, as FlashAttention's benchmarks count local attention: its kernels
        skip the rest, so the rectangle would make a window look many times faster than it is.
        """
        mixed = self.kv_lengths != "full"
        if self.variant.local:
            v = self.variant
            if self.seqlens is not None:
                lens = [(n, n) for n in self.seqlens]
            else:
                lens = [(self.n, nk) for nk in self.cache_lengths or (self.n_keys,) * self.batch]
            seen = sum(
                _visible_pairs(nq, nk, self.causal, v.window_left, v.window_right, v.chunk)
                for nq, nk in lens
            )
            return 4.0 * self.heads * self.d * seen
        if self.seqlens is not None:
            f = sum(4.0 * self.heads * n * n * self.d for n in self.seqlens)
            return f / 2 if self.causal else f
        if mixed:  # the keys each sequence holds (a cache problem's pattern)
            f = sum(4.0 * self.heads * self.n * nk * self.d for nk in self.cache_lengths or ())
            return f / 2 if self.causal else f
        f = 4.0 * self.batch * self.heads * self.n * self.n_keys * self.d
        return f / 2 if self.causal else f

    def tflops(self, ms: float) -> float:
        """Throughput in TFLOP/s of one forward pass taking ``ms`` milliseconds.

        Callers check that ``ms`` is positive (a zero raises ``ZeroDivisionError``).
        """
        # The exact expression every stage used before it lived here, so stored figures stay
        # bit-for-bit the same.
        return self.flops / (ms * 1e-3) / 1e12

    @property
    def study_name(self) -> str:
        """Optuna study name; GPU names are normalised to be filesystem and URL safe."""
        gpu = "".join(ch if ch.isalnum() else "-" for ch in self.gpu).strip("-").lower()
        mask = "causal" if self.causal else "full"
        tail = f"_nk{self.nk}" if self.nk is not None else ""
        gqa = f"_kv{self.kv_heads}" if self.kv_heads is not None else ""
        packed = f"_vl{seqlens_digest(self.seqlens)}" if self.seqlens is not None else ""
        return (
            f"{gpu}_d{self.d}_n{self.n}{tail}_b{self.batch}_h{self.heads}{gqa}_{self.dtype}_{mask}"
            f"{packed}{self.variant.key_text()}{kv_page_text(self.kv_page)}"
            f"{kv_lengths_text(self.kv_lengths)}"
        )

    def to_dict(self) -> dict[str, object]:
        """The fields, the variant's flat and only when it is not plain, ``kv_page`` only
        when set, ``kv_lengths`` only when not ``full``."""
        out = asdict(self)
        del out["variant"]
        if self.kv_page is None:
            del out["kv_page"]
        if self.kv_lengths == "full":
            del out["kv_lengths"]
        if not self.variant.plain:
            out.update({name: getattr(self.variant, name) for name in VARIANT_FIELDS})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Problem:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing optional ones default.

        Raises:
            TypeError: when ``gpu``, ``d`` or ``n`` is missing.
            core.variant.VariantError: variant fields out of their domain.
        """
        names = {f.name for f in fields(cls)} - {"variant"}
        kwargs = {k: v for k, v in data.items() if k in names}
        if kwargs.get("seqlens") is not None:
            kwargs["seqlens"] = tuple(kwargs["seqlens"])
        given = {k: data[k] for k in VARIANT_FIELDS if k in data and data[k] is not None}
        if given:
            kwargs["variant"] = Variant(**given)
        return cls(**kwargs)


@lru_cache(maxsize=1024)
def _visible_pairs(nq: int, nk: int, causal: bool, left: int, right: int, chunk: int) -> int:
    """(row, key) pairs a windowed/chunked call sees: per row, the keys of
    :mod:`core.variant`'s rule (bottom-right aligned, causal the right bound 0)."""
    total = 0
    for i in range(nq):
        pos = i + nk - nq
        lo, hi = 0, nk  # keys [lo, hi)
        if causal:
            hi = min(hi, pos + 1)
        if left >= 0:
            lo = max(lo, pos - left)
        if right >= 0:
            hi = min(hi, pos + right + 1)
        if chunk > 0:
            start = pos - pos % chunk  # Python's % rounds down, as the rule says
            lo, hi = max(lo, start), min(hi, start + chunk)
        total += max(0, hi - lo)
    return total


def seqlens_digest(seqlens: tuple[int, ...]) -> str:
    """8 hex digits naming a list of lengths (study names stay short and filesystem safe)."""
    text = ",".join(map(str, seqlens))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def seqlens_text(seqlens: tuple[int, ...] | None) -> str:
    """How the store keeps a length list: comma-separated, ``""`` for a dense problem."""
    return "" if seqlens is None else ",".join(map(str, seqlens))


def parse_seqlens(text: str) -> tuple[int, ...] | None:
    """Inverse of :func:`seqlens_text`."""
    return tuple(int(x) for x in text.split(",")) if text else None
