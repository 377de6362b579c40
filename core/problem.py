"""A tuning problem: the shape and type of attention a config is tuned for, on one GPU.

Part of the shared floor (:mod:`core`): every stage reads problems, none owns them. The
throughput formula lives here once (:meth:`Problem.tflops`), so the worker, the search, the
replay and the store count TFLOP/s the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from core.config import Dtype


@dataclass(frozen=True)
class Problem:
    """One (GPU, D, N, batch, heads, dtype, causal) point of a campaign.

    ``n`` is both the query and the key length (the campaign's square problems);
    ``nk`` overrides the key length for Nq != Nk. ``kv_heads`` defaults to ``heads``.
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

    @property
    def n_keys(self) -> int:
        return self.nk if self.nk is not None else self.n

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def flops(self) -> float:
        """Forward FLOPs counted the standard way: 4·B·H·Nq·Nk·D, halved for causal."""
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
        return (
            f"{gpu}_d{self.d}_n{self.n}{tail}_b{self.batch}_h{self.heads}{gqa}_{self.dtype}_{mask}"
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Problem:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing optional ones default.

        Raises:
            TypeError: when ``gpu``, ``d`` or ``n`` is missing.
        """
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
