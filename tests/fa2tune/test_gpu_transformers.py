"""``attn_implementation="fa2tune"`` on a GPU (marker ``gpu``): a small random-weight
Llama-shaped model (GQA 8:2, D=64) gives SDPA's logits within bf16 rounding and its greedy
tokens, unpadded and with a left-padded batch, with dynamic and static caches; every
attention call runs fa2tune's kernels (no fallback of either layer is counted or warned)."""

from __future__ import annotations

import warnings

import pytest

from tests.support.gpu import torch_op_skip_reason

_REASON = torch_op_skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

if _REASON is None:
    import torch

    transformers = pytest.importorskip("transformers")
    from fa2tune.integrations import transformers as fa2tune_hf
    from fa2tune.ops.choice import FallbackWarning
    from tests.support.hf_models import paired_llamas


def _models(dtype: object) -> tuple[object, object]:
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.1,  # peaked logits: greedy choices far from ties
    )  # fmt: skip
    torch.manual_seed(0)
    ours, sdpa = paired_llamas(config)
    return ours.to("cuda", dtype).eval(), sdpa.to("cuda", dtype).eval()


def _batch(padded: bool) -> tuple[object, object]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 512, (4, 200), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        for row, n in enumerate((200, 150, 37, 1)):
            mask[row, : 200 - n] = 0
    return ids.cuda(), mask.cuda()


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_logits_match_sdpa(padded: bool) -> None:
    ours, sdpa = _models(torch.bfloat16)
    ids, mask = _batch(padded)
    fa2tune_hf.FALLBACKS.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        with torch.no_grad():
            a = ours(ids, attention_mask=mask).logits.float()
    with torch.no_grad():
        b = sdpa(ids, attention_mask=mask).logits.float()
    valid = mask.bool()
    err = (a[valid] - b[valid]).abs().max().item()
    scale = b[valid].abs().max().item()
    assert err <= 0.02 * scale, (err, scale)
    assert not fa2tune_hf.FALLBACKS


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_gives_sdpas_tokens(cache: str) -> None:
    ours, sdpa = _models(torch.float16)
    ids, mask = _batch(padded=True)
    kw = {"max_new_tokens": 24, "do_sample": False, "pad_token_id": 0,
          "cache_implementation": cache, "disable_compile": True}  # fmt: skip
    fa2tune_hf.FALLBACKS.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        with torch.no_grad():
            a = ours.generate(ids, attention_mask=mask, **kw)
    with torch.no_grad():
        out = sdpa.generate(ids, attention_mask=mask, output_scores=True,
                            return_dict_in_generate=True, **kw)  # fmt: skip
    b, scores = out.sequences, out.scores
    # The same tokens, except where the two kernels' roundings meet a near tie: at the first
    # step where a row differs, SDPA's own logits at that step (its scores, the history
    # being the same up to there) must hold the two candidates within a rounding of each
    # other; a row that never differs is equal throughout.
    prompt = ids.shape[1]
    ties = []
    for row in range(a.shape[0]):
        differ = (a[row, prompt:] != b[row, prompt:]).nonzero()
        if differ.numel() == 0:
            continue
        step = int(differ[0])
        logits = scores[step][row].float()
        gap = (logits[b[row, prompt + step]] - logits[a[row, prompt + step]]).abs().item()
        ties.append((row, step, gap))
        assert gap <= 2e-3 * logits.abs().max().item(), (row, step, gap)
    print(f"{cache}: rows that part at a near tie (row, step, logit gap): {ties}")
    assert not fa2tune_hf.FALLBACKS
