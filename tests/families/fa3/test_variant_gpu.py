"""The fa3 family's variant kernels (window, chunk, softcap, sinks) on an sm_90 GPU (``gpu``).

Each config is built through the product's build and loaded by :mod:`measure.loader`; its
arguments are the plain kernel's (``FaParams``, the family's host preparation, and for a
``_vl`` config ``FaVarlen`` first) followed by ``FaVariant``
(:class:`measure.params.FaVariant`, fa_params.cuh's struct). O and LSE are checked against
a float32 reference written here from core.variant's semantics: O within a bound of the inputs'
rounding, LSE within 2e-2, rows that see no key O = 0 and LSE = -inf or the sink logit.

Shapes: odd lengths, Nq != Nk both ways, GQA 4:2, windows that leave whole blocks without a
key and tiles masked on the left, chunks smaller and larger than a tile.

Run on the GPU machine: ``pytest -m gpu tests/families/fa3/test_variant_gpu.py``.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from codegen.build import build_configs
from core.fa3_config import Fa3Config
from core.settings import get_settings
from measure.params import FaVariant
from tests.support.gpu import gpu_skip_reason


def _hopper_reason() -> str | None:
    reason = gpu_skip_reason()
    if reason is not None:
        return reason
    import torch

    if torch.cuda.get_device_capability(0) != (9, 0):
        return f"the fa3 family needs an sm_90 GPU, found {torch.cuda.get_device_name(0)}"
    if shutil.which(get_settings().nvcc) is None:
        return "nvcc is not on PATH"
    return None


_REASON = _hopper_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"fa3 variant GPU tests: {_REASON}"),
]


@dataclass(frozen=True)
class Case:
    """One call: the shape, the causal switch and the variant's run-time values."""

    batch: int
    heads: int
    kv_heads: int
    nq: int
    nk: int
    causal: bool
    left: int = -1
    right: int = -1
    chunk: int = 0
    softcap: float = 0.0

    @property
    def local(self) -> bool:
        return self.left >= 0 or self.right >= 0 or self.chunk > 0


def visible(case: Case, device: Any) -> Any:
    """[nq, nk] bool: query i sees key j (bottom-right aligned; causal is right bound 0)."""
    import torch

    i = torch.arange(case.nq, device=device)[:, None]
    j = torch.arange(case.nk, device=device)[None, :]
    pos = i + case.nk - case.nq
    ok = torch.ones(case.nq, case.nk, dtype=torch.bool, device=device)
    right = 0 if case.causal else case.right
    if case.left >= 0:
        ok &= j >= pos - case.left
    if right >= 0:
        ok &= j <= pos + right
    if case.chunk > 0:
        start = torch.div(pos, case.chunk, rounding_mode="floor") * case.chunk
        ok &= (j >= start) & (j < start + case.chunk)
    return ok


def reference(q: Any, k: Any, v: Any, scale: float, case: Case, sinks: Any | None) -> Any:
    """float32 O [B, Nq, H, D] and LSE [B, H, Nq] of bnhd tensors."""
    import torch

    group = case.heads // case.kv_heads
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(group, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if case.softcap > 0:
        s = case.softcap * torch.tanh(s / case.softcap)
    s = s.masked_fill(~visible(case, q.device), -math.inf)
    if sinks is not None:
        col = sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        s = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows of -inf only: 0
    o = p[..., : case.nk] @ vf
    return o.transpose(1, 2), lse


def run_case(kernel: Any, config: Fa3Config, case: Case, seed: int) -> list[str]:
    """Launch ``config`` on random inputs of ``case`` (packed when it is a varlen config);
    the mismatches, as text."""
    import torch

    from measure.launch_args import extra_args, launch_geometry, packed_extra_args
    from measure.params import PackedSeqs, make_params, packed_params

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.float16 if config.dtype == "fp16" else torch.bfloat16
    b, h, hk, d = case.batch, case.heads, case.kv_heads, config.d

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dt)

    q, k, v = rnd(b, case.nq, h, d), rnd(b, case.nk, hk, d), rnd(b, case.nk, hk, d)
    sinks = (
        torch.randn(h, generator=g, device="cuda", dtype=torch.float32) * 2
        if config.sinks
        else None
    )
    scale = 1.0 / math.sqrt(d)
    var = FaVariant(case.left, case.right, case.chunk, case.softcap,
                       sinks.data_ptr() if sinks is not None else None)  # fmt: skip
    stream = torch.cuda.current_stream().cuda_stream
    if config.varlen:  # every sequence of the batch at the case's lengths, packed
        qp, kp, vp = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        op = torch.full_like(qp, float("nan"))
        lse_p = torch.full((h, qp.shape[0]), float("nan"), device="cuda")
        cu_q = torch.arange(0, b + 1, device="cuda", dtype=torch.int32) * case.nq
        cu_k = torch.arange(0, b + 1, device="cuda", dtype=torch.int32) * case.nk
        seqs = PackedSeqs(cu_q.data_ptr(), cu_k.data_ptr(), b, case.nq, case.nk)
        params, vl = packed_params(qp, kp, vp, op, lse_p, scale, seqs)
        extra = (vl, *packed_extra_args(config, qp, kp, vp), var)
        grid, block = launch_geometry(config, case.nq, h, b, nk=case.nk, kv_heads=hk)
        kernel.bind(params, grid, block, config.smem_bytes, stream, extra)()
        torch.cuda.synchronize()
        o = op.view(b, case.nq, h, d)
        lse = lse_p.view(h, b, case.nq).transpose(0, 1)
    else:
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, h, case.nq), float("nan"), device="cuda")
        params = make_params(q, k, v, o, lse, scale, "bnhd")
        extra = (*extra_args(config, q, k, v, "bnhd"), var)
        grid, block = launch_geometry(config, case.nq, h, b, nk=case.nk, kv_heads=hk)
        kernel.bind(params, grid, block, config.smem_bytes, stream, extra)()
        torch.cuda.synchronize()
    o_ref, lse_ref = reference(q, k, v, scale, case, sinks)
    where = f"{config.name} {case}"
    bad: list[str] = []
    # The inputs' rounding: O's own (rtol) and P's before P V (atol, |V| up to ~4).
    atol, rtol = (1e-2, 2e-2) if config.dtype == "bf16" else (3e-3, 4e-3)
    excess = (o.float() - o_ref).abs() - rtol * o_ref.abs()
    err = excess.nan_to_num(math.inf).max().item()
    if not err <= atol:
        bad.append(f"{where}: O error {err:.3g} past {rtol} * |O| (atol {atol})")
    finite = torch.isfinite(lse_ref)
    lse_err = (lse - lse_ref).abs()[finite].nan_to_num(math.inf).max().item() if finite.any() else 0
    if not lse_err <= 2e-2:
        bad.append(f"{where}: LSE max error {lse_err:.3g}")
    if not bool((lse[~finite] == -math.inf).all()):
        bad.append(f"{where}: rows that see no key (and no sink) have LSE != -inf")
    return bad


#: Plain tiles whose variant twins run: RS with overlap and ping-pong, SS, serial, three
#: consumer warpgroups, one, D 256.
BASES: list[Fa3Config] = [
    Fa3Config(128, "fp16", False),
    Fa3Config(128, "bf16", True, pv_regs=False),
    Fa3Config(128, "fp16", False, overlap=False, pingpong=False),
    Fa3Config(64, "bf16", False, block_m=192, block_n=128, pv_regs=False, pingpong=False,
              consumer_regs=160),
    Fa3Config(64, "fp16", True, block_m=64, block_n=128, pingpong=False),
    Fa3Config(256, "bf16", True, block_n=80),
]  # fmt: skip


def configs() -> list[Fa3Config]:
    out = []
    for b in BASES:
        out += [
            replace(b, local=True),
            replace(b, softcap=True),
            replace(b, sinks=True),
            replace(b, local=True, softcap=True, sinks=True),
        ]
    out += [replace(BASES[0], varlen=True, local=True, sinks=True),
            replace(BASES[1], varlen=True, local=True, softcap=True, sinks=True)]  # fmt: skip
    return out


def cases(config: Fa3Config) -> list[Case]:
    c = config.causal
    cap = 3.0 if config.softcap else 0.0
    shapes = [(2, 4, 2, 333, 333), (1, 4, 4, 200, 461), (2, 2, 1, 461, 200)]
    if not config.local:
        return [Case(*s, c, softcap=cap) for s in shapes]
    windows = [(64, -1 if not c else 0, 0), (7, 3, 0), (-1, 40, 0), (-1, -1, 100), (30, 5, 256),
               (0, 0, 0)]  # fmt: skip
    return [Case(*s, c, left, right, chunk, cap) for s in shapes for left, right, chunk in windows]


def test_variant_kernels_match_the_reference(tmp_path: Path) -> None:
    import torch

    from measure.loader import LoadedKernel, ensure_context

    ensure_context(torch.cuda.current_device())
    chosen = configs()
    reports = build_configs(chosen, "sm_90", cache_dir=tmp_path, jobs=8)
    failures: list[str] = []
    checked = 0
    for report in reports:
        assert report.cubin is not None, f"{report.config.name}: {report.error}"
        config = report.config
        assert isinstance(config, Fa3Config)
        kernel = LoadedKernel.for_config(config, report.cubin)
        try:
            for n, case in enumerate(cases(config)):
                failures += run_case(kernel, config, case, seed=n)
                checked += 1
        finally:
            kernel.unload()
    assert checked > 0
    assert not failures, f"{len(failures)} of {checked} wrong:\n" + "\n".join(failures[:60])
