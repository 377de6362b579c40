"""``attn_implementation="fa2tune"`` in transformers, on CPU: the registration, the routing of
unpadded and padded calls (the padded ones through the packed path, one unpadding per forward
pass), and the SDPA fallback with its count. On CPU fa2tune's own calls run torch's kernels
(its fallback), so logits must match ``attn_implementation="sdpa"`` to float32 rounding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fa2tune.integrations import transformers as fa2tune_hf  # noqa: E402
from tests.support.hf_models import paired_llamas  # noqa: E402


def _models(**extra: object) -> tuple[object, object]:
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    ours, sdpa = paired_llamas(config)
    assert ours.config._attn_implementation == fa2tune_hf.NAME != sdpa.config._attn_implementation
    return ours.eval(), sdpa.eval()


def _batch(pad_left: bool) -> tuple[object, object]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 96, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    lengths = (12, 7, 3)
    for row, n in enumerate(lengths):
        if pad_left:
            mask[row, : 12 - n] = 0
        else:
            mask[row, n:] = 0
    return ids, mask


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    fa2tune_hf.FALLBACKS.clear()


def test_unpadded_prefill_matches_sdpa() -> None:
    ours, sdpa = _models()
    ids = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = ours(ids).logits, sdpa(ids).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert not fa2tune_hf.FALLBACKS


@pytest.mark.parametrize("pad_left", [True, False], ids=["left", "right"])
def test_padded_batch_goes_through_the_packed_path_and_matches_sdpa(
    pad_left: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, sdpa = _models()
    ids, mask = _batch(pad_left)
    packed_calls: list[int] = []
    unpadded: list[int] = []
    real_varlen, real_unpad = fa2tune_hf.attention_varlen, fa2tune_hf._unpad

    def varlen(q, *args, **kwargs):  # type: ignore[no-untyped-def]
        packed_calls.append(int(q.shape[0]))
        return real_varlen(q, *args, **kwargs)

    def unpad(*args, **kwargs):  # type: ignore[no-untyped-def]
        unpadded.append(1)
        return real_unpad(*args, **kwargs)

    monkeypatch.setattr(fa2tune_hf, "attention_varlen", varlen)
    monkeypatch.setattr(fa2tune_hf, "_unpad", unpad)
    fa2tune_hf._unpadded.clear()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = sdpa(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(a[valid], b[valid], atol=1e-4, rtol=1e-4)
    assert packed_calls == [22, 22]  # both layers, 12 + 7 + 3 valid tokens
    assert len(unpadded) == 2 and len(fa2tune_hf._unpadded) == 1  # computed once, then kept
    assert not fa2tune_hf.FALLBACKS


def test_generation_with_padding_gives_sdpas_tokens() -> None:
    ours, sdpa = _models()
    ids, mask = _batch(pad_left=True)
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        a = ours.generate(ids, attention_mask=mask, **kw)
        b = sdpa.generate(ids, attention_mask=mask, **kw)
    assert torch.equal(a, b)
    assert not fa2tune_hf.FALLBACKS


def test_what_fa2tune_does_not_run_goes_to_sdpa_counted() -> None:
    ours, _ = _models()
    ids = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours(ids, output_attentions=True)
    assert fa2tune_hf.FALLBACKS["attention weights asked for"] == 2  # once per layer
    layer = ours.model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 16)
    k = torch.randn(1, 2, 5, 16)
    four_d = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    out, _ = fa2tune_hf.attention_forward(layer, q, k, k, four_d, scaling=0.25)
    assert out.shape == (1, 5, 4, 16) and fa2tune_hf.FALLBACKS["a 4-D attention mask"] == 1


def test_register_is_idempotent_and_named() -> None:
    from transformers import AttentionInterface

    assert fa2tune_hf.register() == fa2tune_hf.register() == "fa2tune"
    assert AttentionInterface._global_mapping["fa2tune"] is fa2tune_hf.attention_forward
