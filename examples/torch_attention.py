"""A GQA transformer block on ``fa2tune.torch``, eagerly and under ``torch.compile``, vs SDPA.

The block is a Llama-style pre-norm layer (RMSNorm, Q and KV projections, attention, output
projection, a SiLU MLP) with 32 query heads, 8 KV heads and head dim 128 (hidden 4096), in
fp16 by default. It runs two phases:

* prefill: ``--batch`` sequences of ``--seq`` tokens, causal;
* decode: ``--decode-batch`` sequences, one new token each against a KV cache of
  ``--context`` tokens (Nq = 1: the split-KV family's case).

For each phase the same weights run with attention on ``fa2tune.torch.attention`` (``[B, N,
H, D]`` straight from the projections, no transposes) and on
``torch.nn.functional.scaled_dot_product_attention``, eagerly and compiled
(``torch.compile(fullgraph=True)``, ``--compile-mode reduce-overhead`` by default: CUDA graphs,
no Python per call). Attention outputs are checked against SDPA's with the GPU tests'
tolerance (max abs error 2e-2 for fp16, 4e-2 for bf16), block outputs with the same relative
to their largest value, and everything is timed with CUDA events; the table at the end gives
milliseconds per block call (eager and compiled) and per eager attention call.

Needs the ``gpu`` extra (torch, cuda-bindings), nvcc for the first build of a config and an
sm_80+ GPU. Run from the repository root (or with fa2tune installed)::

    python examples/torch_attention.py                       # fp16, compiled with CUDA graphs
    python examples/torch_attention.py --dtype bf16 --compile-mode default
    FA2TUNE_PRINT_CHOICE=1 python examples/torch_attention.py --autotune on_first_call
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fa2tune.torch import attention, autotune

log = logging.getLogger("torch_attention")

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 4e-2}
#: SDPA takes fewer KV heads itself (enable_gqa) from torch 2.5; before, K and V are repeated.
SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA on ``[B, N, H, D]`` tensors with fa2tune's causal rule (bottom-right aligned:
    one new token sees the whole cache)."""
    nq, nk = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if nq == nk:
        mask, causal = None, True
    elif nq == 1:
        mask, causal = None, False
    else:
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        causal = False
    if SDPA_GQA:
        o = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, is_causal=causal, enable_gqa=True
        )
    else:
        group = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal)
    return o.transpose(1, 2)


def fa2tune_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = attention(q, k, v, causal=True)  # [B, N, H, D] in and out
    assert isinstance(out, torch.Tensor)
    return out


class Block(nn.Module):
    """Pre-norm GQA attention + SiLU MLP; ``attend`` is the attention implementation."""

    def __init__(self, attend: Callable[..., torch.Tensor], hidden: int = HEADS * HEAD_DIM):
        super().__init__()
        self.attend = attend
        self.norm1 = nn.RMSNorm(hidden)
        self.q = nn.Linear(hidden, HEADS * HEAD_DIM, bias=False)
        self.kv = nn.Linear(hidden, 2 * KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, hidden, bias=False)
        self.norm2 = nn.RMSNorm(hidden)
        self.up = nn.Linear(hidden, 2 * hidden, bias=False)
        self.down = nn.Linear(2 * hidden, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor | None = None,
        past_v: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        b, n, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, n, HEADS, HEAD_DIM)
        k, v = self.kv(h).view(b, n, 2, KV_HEADS, HEAD_DIM).unbind(2)  # strided views
        if past_k is not None and past_v is not None:
            k, v = torch.cat([past_k, k], 1), torch.cat([past_v, v], 1)
        a = self.attend(q, k, v)
        x = x + self.o(a.reshape(b, n, HEADS * HEAD_DIM))
        return x + self.down(F.silu(self.up(self.norm2(x))))


@dataclass
class Row:
    phase: str
    backend: str
    mode: str
    block_ms: float
    attention_ms: float | None  # eager attention call alone (eager rows only)
    errors: tuple[float, float] | None  # max abs error vs SDPA: attention, block


def cuda_ms(fn: Callable[[], Any], iters: int, warmup: int = 5) -> float:
    """Milliseconds per call of ``fn`` by CUDA events over ``iters`` calls."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def run_phase(
    phase: str, inputs: tuple[torch.Tensor, ...], blocks: dict[str, Block], args: Any
) -> list[Row]:
    """Both backends, eager and compiled, on one phase's inputs: checked and timed."""
    dtype = inputs[0].dtype
    rows: list[Row] = []
    with torch.no_grad():
        reference = blocks["sdpa"](*inputs).float()
        # The attention call alone, on the block's own Q, K and V.
        first = blocks["sdpa"]
        x = inputs[0]
        b, n, _ = x.shape
        h = first.norm1(x)
        q = first.q(h).view(b, n, HEADS, HEAD_DIM)
        k, v = first.kv(h).view(b, n, 2, KV_HEADS, HEAD_DIM).unbind(2)
        if len(inputs) == 3:
            k, v = torch.cat([inputs[1], k], 1), torch.cat([inputs[2], v], 1)
        attend_ref = sdpa_attention(q, k, v).float()
        for backend, block in blocks.items():
            attend = block.attend
            attend_err = float((attend(q, k, v).float() - attend_ref).abs().max())
            attend_ms = cuda_ms(lambda a=attend: a(q, k, v), args.iters)
            modes: dict[str, Callable[..., torch.Tensor]] = {"eager": block}
            if not args.no_compile:
                kwargs = {} if args.compile_mode == "default" else {"mode": args.compile_mode}
                # Static shapes: each phase compiles (and captures) its own graphs.
                modes["compiled"] = torch.compile(block, fullgraph=True, dynamic=False, **kwargs)
            for mode, fn in modes.items():
                log.info("%s: %s %s", phase, backend, mode)
                out = fn(*inputs).float()  # compile (and capture) on the first calls
                out = fn(*inputs).float()  # a CUDA-graph replay's output, copied
                block_err = float((out - reference).abs().max())
                # The attention output against SDPA's: the GPU tests' tolerance. The block's
                # output (values up to ~5) against SDPA's block: the same, relative to its
                # largest value (one bf16 ulp at 4 is 0.03).
                tol = TOLERANCE[dtype]
                block_tol = tol * max(1.0, float(reference.abs().max()))
                if backend != "sdpa" and (attend_err > tol or block_err > block_tol):
                    raise SystemExit(
                        f"{phase} {backend} {mode}: max abs error {attend_err:.3g} (attention, "
                        f"tolerance {tol}), {block_err:.3g} (block, tolerance {block_tol:.3g}) "
                        "against SDPA"
                    )
                rows.append(
                    Row(
                        phase, backend, mode,
                        block_ms=cuda_ms(lambda fn=fn: fn(*inputs), args.iters),
                        attention_ms=attend_ms if mode == "eager" else None,
                        errors=None if backend == "sdpa" else (attend_err, block_err),
                    )
                )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2, help="prefill batch")
    parser.add_argument("--seq", type=int, default=1024, help="prefill tokens per sequence")
    parser.add_argument("--decode-batch", type=int, default=8, help="decode batch")
    parser.add_argument("--context", type=int, default=4096, help="decode KV-cache length")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--iters", type=int, default=50, help="timed calls per figure")
    parser.add_argument(
        "--compile-mode", choices=("default", "reduce-overhead", "max-autotune"),
        default="reduce-overhead", help="torch.compile mode (reduce-overhead: CUDA graphs)",
    )  # fmt: skip
    parser.add_argument("--no-compile", action="store_true", help="eager only")
    parser.add_argument(
        "--autotune", choices=("off", "cached", "on_first_call"), default="cached",
        help="fa2tune.torch.autotune mode (on_first_call: tune untuned shapes in the "
        "background; the next run uses the results)",
    )  # fmt: skip
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per tuning job")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s"
    )
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU")
    autotune(args.autotune, budget_s=args.budget)
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    device = torch.device("cuda")
    fa2 = Block(fa2tune_attention).to(device, dtype).eval()
    for p in fa2.parameters():  # small weights: activations of order one through the block
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
        else:
            nn.init.ones_(p)
    sdpa = Block(sdpa_attention).to(device, dtype).eval()
    sdpa.load_state_dict(fa2.state_dict())
    blocks = {"fa2tune": fa2, "sdpa": sdpa}
    hidden = HEADS * HEAD_DIM

    prefill = (torch.randn(args.batch, args.seq, hidden, device=device, dtype=dtype),)
    cache = (args.decode_batch, args.context, KV_HEADS, HEAD_DIM)
    decode = (
        torch.randn(args.decode_batch, 1, hidden, device=device, dtype=dtype),
        torch.randn(cache, device=device, dtype=dtype),
        torch.randn(cache, device=device, dtype=dtype),
    )
    rows = run_phase("prefill", prefill, blocks, args) + run_phase("decode", decode, blocks, args)

    print(f"\n{torch.cuda.get_device_name()} {args.dtype}, {HEADS} q heads / {KV_HEADS} kv "
          f"heads, D={HEAD_DIM}; prefill B={args.batch} N={args.seq}, decode "
          f"B={args.decode_batch} context={args.context}; ms per call (CUDA events)")  # fmt: skip
    print("| phase | attention | mode | block ms | attention ms (eager) | max abs err vs SDPA "
          "(attention / block) |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        err = "-" if r.errors is None else f"{r.errors[0]:.2e} / {r.errors[1]:.2e}"
        att = "-" if r.attention_ms is None else f"{r.attention_ms:.3f}"
        print(f"| {r.phase} | {r.backend} | {r.mode} | {r.block_ms:.3f} | {att} | {err} |")


if __name__ == "__main__":
    main()
