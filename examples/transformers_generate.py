"""fa2tune as transformers' attention: generate with ``attn_implementation="fa2tune"`` and
with ``"sdpa"`` on the same random-weight Llama-shaped model, and print the first call's
time (it builds fa2tune's kernels: nvcc, or NVRTC where no toolkit is installed), prefill
and decode tokens per second of each, and whether their greedy tokens agree.

    python examples/transformers_generate.py [--layers 4] [--batch 8] [--prompt 2048] [--new 128]

Random weights (nothing is downloaded): the attention's shapes are Llama-3-8B's (32 query
heads over 8 KV heads, D=128), the model has fewer layers.
"""

from __future__ import annotations

import argparse
import copy
import logging
import time

import torch
import transformers

from fa2tune.integrations import transformers as fa2tune_hf


def timed(fn):  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=args.prompt + args.new, initializer_range=0.02,
    )  # fmt: skip
    torch.manual_seed(0)
    name = fa2tune_hf.register()
    make = transformers.LlamaForCausalLM._from_config
    models = {
        impl: make(copy.deepcopy(config), attn_implementation=impl) for impl in (name, "sdpa")
    }
    models["sdpa"].load_state_dict(models[name].state_dict())
    ids = torch.randint(3, 32000, (args.batch, args.prompt), device="cuda")
    kw = {"do_sample": False, "pad_token_id": 0, "disable_compile": True}
    tokens = {}
    for impl, model in models.items():
        model.to("cuda", torch.bfloat16).eval()
        with torch.no_grad():
            _, first = timed(lambda m=model: m(ids[:, :16]))  # first call: builds, loads
            model(ids)  # every shape below once before timing (its kernels built)
            model.generate(ids, max_new_tokens=args.new, **kw)
            prefill = min(timed(lambda m=model: m(ids))[1] for _ in range(3))
            out, total = timed(lambda m=model: m.generate(ids, max_new_tokens=args.new, **kw))
        decode = max(total - prefill, 1e-9)
        tokens[impl] = out
        rates = (args.batch * args.prompt / prefill, args.batch * args.new / decode)
        print(f"{impl:8s} first call {first:6.2f} s | prefill {rates[0]:9.0f} tok/s"
              f" | decode {rates[1]:7.0f} tok/s")  # fmt: skip
        model.to("cpu")
    same = (tokens[name] == tokens["sdpa"]).float().mean().item()
    fallbacks = dict(fa2tune_hf.FALLBACKS) or "none"
    print(f"greedy tokens agree: {same:.4f}; fa2tune fallbacks: {fallbacks}")


if __name__ == "__main__":
    main()
