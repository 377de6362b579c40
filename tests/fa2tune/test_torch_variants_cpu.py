"""Attention variants in fa2tune.torch without a GPU (issue 23 item 3).

Checked on CPU tensors: the variant arguments' validation (window, chunk, softcap, sinks'
shape, dtype and device), the fallback's result against a brute-force reference written
here from core.variant's rules (each variant alone and combined, dense and packed, GQA,
nq != nk, rows that see no key), the normalisation of a call (dense and packed), the decision
keys (plain keys unchanged, variants normalised into them), the choice of a variant call
(the store asked with the variant, defaults with the switches where a family takes them,
else Unsupported with the families' reasons), and the custom ops' schemas and fakes.
Skipped without torch.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from core.shape import Shape  # noqa: E402
from core.variant import PLAIN, Variant, normalize  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    from fa2tune.ops import torch_op

    torch_op.clear_caches()
    yield
    torch_op.clear_caches()


def _sees(i: int, j: int, nq: int, nk: int, causal: bool, v: Variant) -> bool:
    """core.variant's rule for one (query, key) pair, written out."""
    pos = i + nk - nq
    if causal and j > pos:
        return False
    if v.window_left >= 0 and j < pos - v.window_left:
        return False
    if v.window_right >= 0 and j > pos + v.window_right:
        return False
    if v.chunk > 0:
        start = (pos // v.chunk) * v.chunk  # Python's // rounds down, as the rule says
        if not start <= j < start + v.chunk:
            return False
    return True


def _reference(
    q: Any, k: Any, v: Any, causal: bool, variant: Variant, scale: float, sinks: Any = None
) -> tuple[Any, Any]:
    """Brute force, one row at a time in float64: q, k, v ``[B, N, H, D]``."""
    b, nq, h, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    o = torch.zeros(b, nq, h, d, dtype=torch.float64)
    lse = torch.full((b, h, nq), float("-inf"), dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hkv)
            for i in range(nq):
                seen = [j for j in range(nk) if _sees(i, j, nq, nk, causal, variant)]
                logits = [float(q[bi, i, hi].double() @ k[bi, j, kh].double()) * scale
                          for j in seen]  # fmt: skip
                if variant.softcap > 0:
                    logits = [variant.softcap * math.tanh(x / variant.softcap) for x in logits]
                terms = list(logits)
                if sinks is not None:
                    terms.append(float(sinks[hi]))
                if not terms:
                    continue
                m = max(terms)
                total = sum(math.exp(x - m) for x in terms)
                lse[bi, hi, i] = m + math.log(total)
                for x, j in zip(logits, seen, strict=True):
                    o[bi, i, hi] += math.exp(x - m) / total * v[bi, j, kh].double()
    return o, lse


def _qkv(b: int, nq: int, nk: int, h: int, hkv: int, d: int = 8) -> tuple[Any, Any, Any]:
    gen = torch.Generator().manual_seed(nq * 131 + nk)
    q = torch.randn(b, nq, h, d, generator=gen)
    k = torch.randn(b, nk, hkv, d, generator=gen)
    return q, k, torch.randn(b, nk, hkv, d, generator=gen)


CASES = [
    # (nq, nk, causal, window, chunk, softcap, sinks)
    (5, 9, False, (2, 1), 0, 0.0, False),
    (9, 5, False, (1, 0), 0, 0.0, False),
    (7, 7, True, (3, -1), 0, 0.0, False),
    (6, 10, False, (-1, -1), 4, 0.0, False),
    (10, 6, False, (-1, -1), 4, 0.0, False),  # rows before the first key see no chunk
    (8, 8, True, (-1, -1), 3, 0.0, False),
    (6, 9, False, (-1, -1), 0, 2.0, False),
    (6, 9, True, (-1, -1), 0, 0.5, False),
    (6, 9, False, (-1, -1), 0, 0.0, True),
    (9, 4, True, (-1, -1), 0, 0.0, True),  # dead causal rows: O = 0, LSE = the sink
    (8, 12, True, (2, -1), 5, 3.0, True),  # everything at once
    (7, 7, False, (0, 0), 0, 0.0, False),  # a window of one key
]


@pytest.mark.parametrize(("nq", "nk", "causal", "window", "chunk", "cap", "with_sinks"), CASES)
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
def test_fallback_matches_brute_force(
    nq: int, nk: int, causal: bool, window: tuple[int, int], chunk: int, cap: float,
    with_sinks: bool, layout: str,
) -> None:  # fmt: skip
    from fa2tune.torch import FallbackWarning, attention

    q, k, v = _qkv(2, nq, nk, 4, 2)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(7)) if with_sinks else None
    scale = 0.37
    args = (q, k, v) if layout == "bnhd" else tuple(t.transpose(1, 2).contiguous()
                                                    for t in (q, k, v))  # fmt: skip
    with pytest.warns(FallbackWarning):
        o, lse = attention(*args, causal=causal, scale=scale, return_lse=True, layout=layout,
                           window_size=window, attention_chunk=chunk, softcap=cap,
                           sinks=sinks)  # fmt: skip
    o_plain = attention(*args, causal=causal, scale=scale, layout=layout, window_size=window,
                        attention_chunk=chunk, softcap=cap, sinks=sinks)  # fmt: skip
    assert isinstance(o_plain, torch.Tensor)
    _, variant = normalize(causal, *window, chunk, softcap=cap, sinks=with_sinks)
    ref_o, ref_lse = _reference(q, k, v, causal, variant, scale, sinks)
    if layout == "bhnd":
        o, o_plain = o.transpose(1, 2), o_plain.transpose(1, 2)
    torch.testing.assert_close(o.double(), ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o_plain.double(), ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_dead_rows_without_sinks_are_zero_and_minus_inf() -> None:
    from fa2tune.torch import attention

    q, k, v = _qkv(1, 6, 6, 2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # nq 6, nk 2, a window (0, 0): row i sees key pos = i - 4 only, so rows 0..3 (pos < 0)
        # see no key.
        o, lse = attention(q, k[:, :2], v[:, :2], window_size=(0, 0), return_lse=True)
    assert torch.all(o[:, :4] == 0) and torch.all(torch.isneginf(lse[:, :, :4]))
    assert torch.all(torch.isfinite(lse[:, :, 4:]))


@pytest.mark.parametrize(("cu", "cu_k", "causal", "window", "chunk", "cap", "with_sinks"), [
    # the second sequence has queries but no keys: O = 0, LSE = -inf or its sink
    ([0, 3, 6, 10, 12], [0, 4, 4, 9, 15], True, (2, -1), 0, 0.0, True),
    ([0, 5, 9, 9, 14], [0, 4, 9, 9, 15], False, (-1, -1), 3, 1.5, False),
    ([0, 4, 11], [0, 6, 8], False, (1, 1), 0, 0.0, True),
    ([0, 3, 6, 10, 12], [0, 4, 4, 9, 15], False, (-1, -1), 0, 2.0, False),
])  # fmt: skip
def test_varlen_fallback_matches_brute_force_per_sequence(
    cu: list[int], cu_k: list[int], causal: bool, window: tuple[int, int], chunk: int,
    cap: float, with_sinks: bool,
) -> None:  # fmt: skip
    from fa2tune.torch import attention_varlen

    total_q, total_k, h, hkv, d = cu[-1], cu_k[-1], 4, 2, 8
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(total_q, h, d, generator=gen)
    k = torch.randn(total_k, hkv, d, generator=gen)
    v = torch.randn(total_k, hkv, d, generator=gen)
    sinks = torch.randn(h, generator=gen) if with_sinks else None
    lengths_q = [b - a for a, b in itertools.pairwise(cu)]
    lengths_k = [b - a for a, b in itertools.pairwise(cu_k)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o, lse = attention_varlen(
            q, k, v, torch.tensor(cu, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32),
            max(lengths_q), max(lengths_k), causal=causal, scale=0.5, return_lse=True,
            window_size=window, attention_chunk=chunk, softcap=cap, sinks=sinks,
        )  # fmt: skip
    for i, nq in enumerate(lengths_q):
        if nq == 0:
            continue
        qs, ks = slice(cu[i], cu[i + 1]), slice(cu_k[i], cu_k[i + 1])
        # Each sequence on its own lengths (normalisation is per call: the raw variant).
        variant = Variant(*window, chunk, cap, with_sinks)
        ref_o, ref_lse = _reference(q[qs][None], k[ks][None], v[ks][None], causal, variant, 0.5,
                                    sinks)  # fmt: skip
        torch.testing.assert_close(o[qs].double(), ref_o[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[:, qs].double(), ref_lse[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"window_size": (3,)}, "window_size must be a pair"),
    ({"window_size": "ab"}, "window_size must be a pair"),
    ({"window_size": (-2, 0)}, "window_size bounds"),
    ({"attention_chunk": -1}, "attention_chunk"),
    ({"softcap": -1.0}, "softcap"),
    ({"softcap": float("nan")}, "softcap"),
    ({"sinks": [0.0, 0.0, 0.0, 0.0]}, "sinks must be a tensor"),
    ({"sinks": torch.zeros(3)}, r"sinks must have shape \[4\]"),
    ({"sinks": torch.zeros(4, 1)}, r"sinks must have shape \[4\]"),
    ({"sinks": torch.zeros(4, dtype=torch.int32)}, "sinks must be float32"),
    ({"sinks": torch.zeros(4, device="meta")}, "sinks is on meta"),
])  # fmt: skip
@pytest.mark.parametrize("packed", [False, True])
def test_bad_variant_arguments_are_value_errors(
    kwargs: dict[str, Any], words: str, packed: bool
) -> None:
    from fa2tune.torch import attention, attention_varlen

    q, k, v = _qkv(1, 4, 4, 4, 2)
    with pytest.raises(ValueError, match=words):
        if packed:
            cu = torch.tensor([0, 4], dtype=torch.int32)
            attention_varlen(q[0], k[0], v[0], cu, cu, 4, 4, **kwargs)
        else:
            attention(q, k, v, **kwargs)


def test_half_precision_sinks_are_converted() -> None:
    from fa2tune.torch import attention

    q, k, v = _qkv(1, 4, 6, 4, 2)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o32, lse32 = attention(q, k, v, sinks=sinks, return_lse=True)
        o16, lse16 = attention(q, k, v, sinks=sinks.to(torch.bfloat16), return_lse=True)
    torch.testing.assert_close(o16, o32)  # these values are exact in bf16
    torch.testing.assert_close(lse16, lse32)


def test_fallback_false_raises_unsupported_for_variants() -> None:
    from fa2tune.torch import Unsupported, attention

    q, k, v = _qkv(1, 4, 4, 2, 2)
    with pytest.raises(Unsupported, match="cpu"):
        attention(q, k, v, window_size=(1, 1), fallback=False)


def test_normalize_call_dense_is_core_normalize() -> None:
    from fa2tune.ops.choice import normalize_call

    for args in [(False, -1, 0, 0), (True, 5, -1, 0), (False, 100, 100, 0), (True, -1, -1, 64),
                 (False, 2, 3, 16)]:  # fmt: skip
        got = normalize_call(*args, 0.0, False, 10, 20)
        assert got == normalize(*args, nq=10, nk=20)
    assert normalize_call(False, -1, 0, 0, 0.0, False, 8, 8) == (True, PLAIN)  # (-1, 0) is causal


def test_normalize_call_packed_keeps_a_chunk_past_the_longest_keys() -> None:
    from fa2tune.ops.choice import normalize_call

    # A dense call with nk >= nq drops a chunk holding every key; a packed batch cannot know
    # that each sequence has nk >= nq, so it keeps the chunk.
    assert normalize_call(False, -1, -1, 64, 0.0, False, 16, 32)[1].chunk == 0
    assert normalize_call(False, -1, -1, 64, 0.0, False, 16, 32, True)[1].chunk == 64
    # Window bounds past the longest lengths are none for every sequence.
    causal, v = normalize_call(False, 40, 40, 0, 0.0, False, 16, 32, True)
    assert (causal, v) == (False, PLAIN)
    assert normalize_call(False, 4, 15, 0, 0.0, False, 16, 32, True)[1] == Variant(4, -1)


def test_decision_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    from fa2tune.ops import torch_op
    from fa2tune.torch import attention

    made: list[tuple[bool, Variant]] = []

    def fake_decide(q: Any, k: Any, causal: bool, layout: Any, packed: Any = None,
                    variant: Variant = PLAIN) -> str:  # fmt: skip
        made.append((causal, variant))
        return "test"

    monkeypatch.setattr(torch_op, "_decide", fake_decide)
    q, k, v = _qkv(1, 8, 8, 2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attention(q, k, v, causal=True)
        attention(q, k, v, window_size=(-1, 0))  # normalised: the causal call's decision
        attention(q, k, v, window_size=(3, 0))
        attention(q, k, v, window_size=(3, 0))  # the same key again
        attention(q, k, v, window_size=(3, 100))  # right bound past every key: (3, -1)
        attention(q, k, v, window_size=(3, -1))
        attention(q, k, v, softcap=2.0)
        attention(q, k, v, softcap=2.0, sinks=torch.zeros(2))
    assert made == [(True, PLAIN), (True, Variant(3, 0)), (False, Variant(3, -1)),
                    (False, Variant(softcap=2.0)),
                    (False, Variant(softcap=2.0, sinks=True))]  # fmt: skip
    plain_key = (q.device, q.dtype, q.shape, k.shape, True, "bnhd")
    assert plain_key in torch_op._decisions  # plain keys are what they always were
    local_key = (*plain_key[:4], True, "bnhd", Variant(3, 0))
    assert local_key in torch_op._decisions


def test_packed_decision_key_includes_the_variant_only_when_not_plain() -> None:
    from fa2tune.ops.choice import decision_key

    base = decision_key("cuda:0", "fp16", 64, 8, 2, True, 3, 300, 128)
    assert decision_key("cuda:0", "fp16", 64, 8, 2, True, 3, 300, 128, PLAIN) == base
    local = decision_key("cuda:0", "fp16", 64, 8, 2, True, 3, 300, 128, Variant(16, 0))
    assert local == (*base, Variant(16, 0))


def _call(variant: Variant, packed: Any = None) -> Any:
    from fa2tune.ops.choice import Call

    return Call(0, "NVIDIA H200", 132, "9.0", Shape(1024, 1024, 2, 16, 16), "bf16", True, 128,
                packed, variant)  # fmt: skip


def test_variant_calls_unsupported_while_no_family_builds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from codegen.families.fa2 import space as fa2_space
    from codegen.families.splitkv import space as splitkv_space
    from fa2tune.ops.choice import Unsupported, choose

    monkeypatch.setattr(fa2_space, "VARIANT_SWITCHES", ())
    monkeypatch.setattr(splitkv_space, "VARIANT_SWITCHES", ())
    with pytest.raises(Unsupported, match="the fa2 family has no local kernels"):
        choose(None, _call(Variant(128, 0)))
    assert choose(None, _call(PLAIN)).source == "default"


def test_variant_defaults_get_the_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    from codegen.families.fa2 import space as fa2_space
    from core.lookup import Packed
    from fa2tune.ops.choice import choose, default_config

    monkeypatch.setattr(fa2_space, "VARIANT_SWITCHES", ("local", "softcap", "sinks"))
    variant = Variant(128, 0, softcap=30.0, sinks=True)
    choice = choose(None, _call(variant))
    plain = choose(None, _call(PLAIN)).config
    assert choice.source == "default"
    assert choice.config == replace(plain, local=True, softcap=True, sinks=True)
    packed = choose(None, _call(Variant(chunk=64), Packed(4, 256)))
    got: Any = packed.config
    assert got.varlen and got.local and not got.sinks
    # A decode-like call prefers split-KV, with the variant's switches; a family without
    # them is passed over: then fa2's default serves it.
    decode = Shape(1, 4096, 1, 8, 8)
    config = default_config(128, "bf16", False, decode, 132, Variant(softcap=5.0))
    assert config is not None and config.family == "splitkv" and config.softcap
    from codegen.families.splitkv import space as splitkv_space

    monkeypatch.setattr(splitkv_space, "VARIANT_SWITCHES", ())
    config = default_config(128, "bf16", False, decode, 132, Variant(softcap=5.0))
    assert config is not None and config.family == "fa2" and config.softcap


class FakeStore:
    """A store whose every group answers ``answer``; records what each read and match asked."""

    def __init__(self, answer: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []  # candidate_set's keywords, one per read
        self.matched: list[dict[str, Any]] = []
        self.answer = answer

    def candidate_set(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        store = self

        class Group:
            def match(self, *args: Any, **kwargs: Any) -> Any:
                store.matched.append(kwargs)
                return store.answer

        return Group()


def test_the_store_is_asked_for_the_variants_switches_and_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from codegen.families.fa2 import space as fa2_space
    from fa2tune.ops.choice import choose, forget_results

    monkeypatch.setattr(fa2_space, "VARIANT_SWITCHES", ("local", "softcap", "sinks"))
    forget_results()
    store = FakeStore()
    choose(store, _call(PLAIN))  # type: ignore[arg-type]
    choose(store, _call(Variant(64, 0)))  # type: ignore[arg-type]
    assert store.calls[0]["needs"] == PLAIN.needs
    assert store.calls[1]["needs"] == {"local": True, "softcap": False, "sinks": False}
    assert [m["variant"] for m in store.matched] == [PLAIN, Variant(64, 0)]
    # Another window of the same switches is the same group: matched, not read again.
    choose(store, _call(Variant(128, 0)))  # type: ignore[arg-type]
    assert len(store.calls) == 2 and store.matched[-1]["variant"] == Variant(128, 0)
    forget_results()


def test_a_stored_config_of_another_variant_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    from codegen.families.fa2 import space as fa2_space
    from codegen.families.fa2.space import fa2_default_config
    from fa2tune.ops.choice import choose, serves_variant

    monkeypatch.setattr(fa2_space, "VARIANT_SWITCHES", ("local", "softcap", "sinks"))
    tuned = replace(fa2_default_config(128, "bf16", True), local=True, br=64)

    class Found:
        class result:  # the shape of db.queries.Match's field
            config = tuned
            exact = True

        measured = Shape(1024, 1024, 2, 16, 16)

    from fa2tune.ops.choice import forget_results

    forget_results()
    store = FakeStore(Found())
    assert choose(store, _call(Variant(64, 0))).config == tuned  # type: ignore[arg-type]
    # The same answer for a softcap call: it lacks the softcap switch, so the default serves.
    got = choose(store, _call(Variant(softcap=3.0)))  # type: ignore[arg-type]
    assert got.source == "default" and got.config.softcap
    assert serves_variant(tuned, Variant(64, 0)) and not serves_variant(tuned, PLAIN)


def test_op_schemas_take_the_variant_and_fakes_give_shapes() -> None:
    import fa2tune.torch  # noqa: F401  (registers the ops)

    dense = str(torch.ops.fa2tune.attention.default._schema)
    packed = str(torch.ops.fa2tune.attention_varlen.default._schema)
    for schema in (dense, packed):
        assert "window_left=-1" in schema and "window_right=-1" in schema
        assert "chunk=0" in schema and "float softcap=0." in schema
        assert "Tensor? sinks=None" in schema
    q = torch.empty(2, 16, 4, 64, device="meta", dtype=torch.float16)
    k = torch.empty(2, 32, 2, 64, device="meta", dtype=torch.float16)
    sinks = torch.empty(4, device="meta")
    o, lse = torch.ops.fa2tune.attention(q, k, k, True, 0.125, "bnhd", True, True, 8, 0, 0, 0.0,
                                         sinks)  # fmt: skip
    assert o.shape == q.shape and lse.shape == (2, 4, 16)


def test_ops_dispatch_with_variants_on_cpu() -> None:
    from fa2tune.torch import attention

    q, k, v = _qkv(1, 6, 6, 2, 2)
    sinks = torch.tensor([0.3, -0.2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o, lse = torch.ops.fa2tune.attention(q, k, v, True, 0.25, "bnhd", True, True, 2, 0, 0,
                                             1.5, sinks)  # fmt: skip
        o2, lse2 = attention(q, k, v, causal=True, scale=0.25, return_lse=True,
                             window_size=(2, 0), softcap=1.5, sinks=sinks)  # fmt: skip
    torch.testing.assert_close(o, o2)
    torch.testing.assert_close(lse, lse2)


def test_variants_traced_by_torch_compile_fullgraph() -> None:
    """Dynamo traces a variant call to the one custom op (window, chunk, softcap and the
    sinks tensor as its arguments, no graph break); on CPU tensors it falls back inside."""
    from fa2tune.torch import attention, attention_varlen

    q, k, v = _qkv(2, 8, 12, 4, 2)
    sinks = torch.tensor([0.1, 0.2, -0.3, 0.4])
    cu = torch.tensor([0, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 12], dtype=torch.int32)

    def block(q: Any, k: Any, v: Any, sinks: Any) -> Any:
        dense = attention(q * 1.0, k, v, causal=True, window_size=(3, 0), attention_chunk=5,
                          softcap=2.0, sinks=sinks)  # fmt: skip
        packed = attention_varlen(q[0] * 1.0, k[0], v[0], cu, cu_k, 8, 12, window_size=(2, 2),
                                  sinks=sinks)  # fmt: skip
        return dense.sum(dim=-1), packed.sum(dim=-1)

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning, inside the op
        dense, packed = compiled(q, k, v, sinks)
    _, variant = normalize(True, 3, 0, 5, softcap=2.0, sinks=True)
    ref = _reference(q, k, v, True, variant, 1 / math.sqrt(8), sinks)[0].sum(dim=-1)
    torch.testing.assert_close(dense.double(), ref, atol=1e-4, rtol=1e-4)
    ref_p = _reference(q[:1], k[:1], v[:1], False, Variant(2, 2, sinks=True), 1 / math.sqrt(8),
                       sinks)[0][0].sum(dim=-1)  # fmt: skip
    torch.testing.assert_close(packed.double(), ref_p, atol=1e-4, rtol=1e-4)


def test_the_decision_table_is_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode loop over growing lengths makes a key per length: the table keeps the newest
    MAX_DECISIONS (CPU calls: each key's decision is the reason it falls back)."""
    from fa2tune.ops import torch_op
    from fa2tune.torch import attention

    monkeypatch.setattr(torch_op, "MAX_DECISIONS", 8)
    q = torch.randn(1, 1, 2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for nk in range(1, 21):
            kv = torch.randn(1, nk, 2, 16)
            attention(q, kv, kv)
    keys = [key for key in torch_op._decisions if key[2] == q.shape]
    assert len(torch_op._decisions) == 8
    assert [int(key[3][1]) for key in keys] == list(range(13, 21))
