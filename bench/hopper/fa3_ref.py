"""Reference, verification rule and timing for the fa3 harness (torch only; self-contained).

The same rule as the product's verification (fa2 family), restated here so the harness runs on
its own:

* S = scale * Q K^T with scale = 1/sqrt(D); O = softmax(S) V; LSE = ln sum exp S (float32).
* Causal is bottom-right aligned: key j is visible to query i iff j <= i + nk - nq.
* GQA: query head h reads kv head h // (Hq / Hkv).
* Rows that see no key: O exactly 0 and LSE exactly -inf.
* Outputs are poisoned with NaN before the launch; every element of O must be finite.
* LSE within 1e-2 + 1e-3 |ref|; O within max(2 x SDPA flash's max error on the same inputs,
  floor), floor = max(1e-3 fp16 / 8e-3 bf16, 2 u max|ref|) (u = 2^-11 fp16, 2^-8 bf16).
* The float32 reference covers every (batch, head) pair while B*Hq*Nq*Nk <= 2^30, else the
  first, a middle and the last pair.
"""

from __future__ import annotations

import math
import secrets
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ERROR_FLOOR = {"fp16": 1e-3, "bf16": 8e-3}
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
SDPA_FACTOR = 2.0
LSE_ABS_TOL = 1e-2
LSE_REL_TOL = 1e-3
FULL_CHECK_LIMIT = 2**30


@dataclass(frozen=True)
class Shape:
    """One attention problem."""

    d: int
    nq: int
    nk: int
    batch: int = 2
    heads: int = 16
    kv_heads: int = 16
    dtype: str = "fp16"
    causal: bool = False

    @property
    def flops(self) -> float:
        """4·B·H·Nq·Nk·D, halved for causal (the usual count)."""
        f = 4.0 * self.batch * self.heads * self.nq * self.nk * self.d
        return f / 2 if self.causal else f

    @property
    def dead_rows(self) -> int:
        return max(0, self.nq - self.nk) if self.causal else 0


@dataclass(eq=False)
class Inputs:
    """Inputs in one layout, the float32 reference on some pairs and SDPA's error."""

    shape: Shape
    layout: str
    seed: int
    scale: float
    q: Any
    k: Any
    v: Any
    pairs: list[tuple[int, int]]
    ref_o: Any
    ref_lse: Any
    ref_absmax: float
    sdpa_err: float | None = None
    sdpa_note: str = ""
    _out: Any = field(default=None, repr=False)

    def bhnd(self) -> tuple[Any, Any, Any]:
        return tuple(as_bhnd(t, self.layout) for t in (self.q, self.k, self.v))  # type: ignore

    def outputs(self) -> tuple[Any, Any]:
        """O (in the layout) and LSE buffers, allocated once."""
        import torch

        if self._out is None:
            s = self.shape
            shp = (s.batch, s.nq, s.heads, s.d) if self.layout == "bnhd" else (
                s.batch, s.heads, s.nq, s.d)
            o = torch.empty(shp, dtype=self.q.dtype, device=self.q.device)
            lse = torch.empty((s.batch, s.heads, s.nq), dtype=torch.float32, device=o.device)
            self._out = (o, lse)
        return self._out


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def as_bhnd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(1, 2) if layout == "bnhd" else t


def choose_pairs(s: Shape, seed: int) -> list[tuple[int, int]]:
    every = [(b, h) for b in range(s.batch) for h in range(s.heads)]
    if s.batch * s.heads * s.nq * s.nk <= FULL_CHECK_LIMIT:
        return every
    mid = every[1 + seed % max(1, len(every) - 2)] if len(every) > 2 else every[0]
    return sorted({every[0], mid, every[-1]})


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Shape, scale: float,
              pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 O [P, Nq, D] and LSE [P, Nq] of bhnd q, k, v on ``pairs``."""
    import torch

    group = s.heads // s.kv_heads
    outs, lses = [], []
    rows = torch.arange(s.nq, device=q.device)[:, None]
    cols = torch.arange(s.nk, device=q.device)[None, :]
    hidden = cols > rows + (s.nk - s.nq) if s.causal else None
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for b, h in pairs:
            qq = q[b, h].float()
            kk = k[b, h // group].float()
            vv = v[b, h // group].float()
            sc = (qq @ kk.T) * scale
            if hidden is not None:
                sc.masked_fill_(hidden, -math.inf)
            lse = torch.logsumexp(sc, dim=-1)
            p = torch.exp(sc - lse[:, None])
            p = torch.nan_to_num(p, nan=0.0)  # rows with no key: all -inf -> 0
            outs.append(p @ vv)
            lses.append(lse)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return torch.stack(outs), torch.stack(lses)


def sdpa_callable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                  backend: str) -> Callable[[], torch.Tensor]:
    """torch SDPA restricted to ``backend`` ("flash" or "cudnn") on bhnd tensors.

    Bottom-right causal with nq != nk goes through the flash aten op (what torch's
    LOWER_RIGHT causal bias calls); GQA expands the kv heads.

    Raises:
        RuntimeError: when the backend cannot run the case (probed once here).
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if causal and q.shape[2] != k.shape[2]:
        if backend != "flash":
            raise RuntimeError(f"no bottom-right causal path for {backend}")

        def fn() -> torch.Tensor:
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, True, False, scale=scale)[0]
    else:
        be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

        def fn() -> torch.Tensor:
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    fn()
    return fn


def make_inputs(s: Shape, layout: str = "bnhd", seed: int | None = None,
                sdpa: bool = True) -> Inputs:
    """Fresh standard-normal inputs, the reference, and SDPA flash's error on them."""
    import torch

    seed = secrets.randbits(31) if seed is None else seed
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(s.dtype)

    def draw(n: int, h: int) -> torch.Tensor:
        shp = (s.batch, n, h, s.d) if layout == "bnhd" else (s.batch, h, n, s.d)
        return torch.randn(shp, generator=gen, dtype=dt, device="cuda")

    q, k, v = draw(s.nq, s.heads), draw(s.nk, s.kv_heads), draw(s.nk, s.kv_heads)
    scale = 1.0 / math.sqrt(s.d)
    pairs = choose_pairs(s, seed)
    qb, kb, vb = (as_bhnd(t, layout) for t in (q, k, v))
    ref_o, ref_lse = reference(qb, kb, vb, s, scale, pairs)
    inp = Inputs(s, layout, seed, scale, q, k, v, pairs, ref_o, ref_lse,
                 float(ref_o.abs().max()))
    if sdpa:
        try:
            out = sdpa_callable(qb, kb, vb, s.causal, scale, "flash")()
            max_abs, _, _ = errors(out, inp, "bhnd")
            if math.isfinite(max_abs):
                inp.sdpa_err = max_abs
        except RuntimeError as exc:
            inp.sdpa_note = str(exc)[:200]
    return inp


def errors(out: torch.Tensor, inp: Inputs, layout: str | None = None
           ) -> tuple[float, float, tuple[int, int, int, int]]:
    """(max |O - ref|, ||O - ref|| / ||ref||, worst (b, h, row, col)) over live rows."""
    import torch

    ob = as_bhnd(out, layout or inp.layout)
    dead = inp.shape.dead_rows
    worst, at, se, sr = -1.0, (0, 0, 0, 0), 0.0, 0.0
    for i, (b, h) in enumerate(inp.pairs):
        o = ob[b, h, dead:].float()
        r = inp.ref_o[i, dead:]
        if not bool(torch.isfinite(o).all()):
            return math.inf, math.inf, (b, h, -1, -1)
        diff = (o - r).abs()
        if diff.numel() == 0:
            continue
        m = float(diff.max())
        if m > worst:
            idx = int(diff.argmax())
            worst, at = m, (b, h, idx // diff.shape[1] + dead, idx % diff.shape[1])
        se += float((diff.double() ** 2).sum())
        sr += float((r.double() ** 2).sum())
    return max(worst, 0.0), math.sqrt(se / sr) if sr > 0 else math.sqrt(se), at


def tolerance(inp: Inputs) -> float:
    floor = max(ERROR_FLOOR[inp.shape.dtype], 2.0 * UNIT_ROUNDOFF[inp.shape.dtype] * inp.ref_absmax)
    return floor if inp.sdpa_err is None else max(SDPA_FACTOR * inp.sdpa_err, floor)


def poison(o: torch.Tensor, lse: torch.Tensor | None) -> None:
    o.fill_(float("nan"))
    if lse is not None:
        lse.fill_(float("nan"))


@dataclass
class Verdict:
    ok: bool
    max_abs_err: float
    rel_err: float
    tol: float
    message: str


def check(o: torch.Tensor, lse: torch.Tensor | None, inp: Inputs) -> Verdict:
    """The rule of the module docstring."""
    import torch

    tol = tolerance(inp)
    ob = as_bhnd(o, inp.layout)
    n_bad = int((~torch.isfinite(ob)).sum())
    if n_bad:
        return Verdict(False, math.inf, math.inf, tol, f"O has {n_bad}/{ob.numel()} non-finite")
    dead = inp.shape.dead_rows
    if dead:
        if not bool((ob[:, :, :dead] == 0).all()):
            return Verdict(False, math.nan, math.nan, tol, "rows that see no key: O != 0")
        if lse is not None and not bool(torch.isneginf(lse[:, :, :dead]).all()):
            return Verdict(False, math.nan, math.nan, tol, "rows that see no key: LSE != -inf")
    max_abs, rel, (b, h, row, col) = errors(o, inp)
    if lse is not None:
        if not bool(torch.isfinite(lse[:, :, dead:]).all()):
            return Verdict(False, max_abs, rel, tol, "LSE non-finite on live rows")
        for i, (pb, ph) in enumerate(inp.pairs):
            ref = inp.ref_lse[i, dead:]
            excess = (lse[pb, ph, dead:] - ref).abs() - (LSE_ABS_TOL + LSE_REL_TOL * ref.abs())
            if excess.numel() and float(excess.max()) > 0:
                r = int(excess.argmax()) + dead
                return Verdict(False, max_abs, rel, tol,
                               f"LSE wrong at b={pb} h={ph} row={r}: "
                               f"{float(lse[pb, ph, r]):.6g} vs {float(inp.ref_lse[i, r]):.6g}")
    yard = f"sdpa-flash {inp.sdpa_err:.2e}" if inp.sdpa_err is not None else "floor only"
    if max_abs > tol:
        return Verdict(False, max_abs, rel, tol, f"max|O-ref| {max_abs:.3e} > tol {tol:.2e} "
                       f"({yard}) at b={b} h={h} row={row} col={col}")
    return Verdict(True, max_abs, rel, tol, f"max|O-ref| {max_abs:.3e} <= tol {tol:.2e} ({yard})")


_FLUSH: dict[int, Any] = {}


def time_ms(fn: Callable[[], object], target_ms: float = 150.0, min_reps: int = 10,
            max_reps: int = 300, warmup: int = 5) -> tuple[float, int]:
    """(median ms, reps) of ``fn`` with CUDA events; a 2 x L2 buffer is zeroed before each rep."""
    import torch

    dev = torch.cuda.current_device()
    if dev not in _FLUSH:
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size
        _FLUSH[dev] = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    flush = _FLUSH[dev]

    def run(reps: int) -> list[float]:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
        for a, b in ev:
            flush.zero_()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in ev]

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    est = statistics.median(run(3))
    reps = int(min(max_reps, max(min_reps, target_ms / max(est, 1e-3))))
    return statistics.median(run(reps)), reps
