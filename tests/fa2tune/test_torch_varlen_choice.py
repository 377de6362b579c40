"""fa2tune.torch.attention_varlen's torch-free parts: the decision key, argument checks and
the choice of a packed call (the one choice path with a Packed descriptor: the store's
best_match, the FA2 default's varlen twin).

The op itself needs torch (tests/test_torch_varlen_cpu.py) and a GPU
(tests/test_gpu_torch_varlen.py); the rules it applies run here without either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from codegen.families.fa2.space import fa2_default_config
from codegen.families.fa3.space import default_config as fa3_default
from core.fa2_config import Fa2Config
from core.lookup import Packed
from core.problem import Problem
from core.shape import Shape
from db.store import Store
from fa2tune.ops import autotune
from fa2tune.ops.choice import (
    Call,
    Choice,
    Unsupported,
    call_reason,
    check_varlen_shapes,
    choose,
    decision_key,
    default_varlen_config,
    effective_varlen_causal,
    mean_bucket,
)
from fa2tune.ops.selection import select
from tests.support.factories import H200, make_config, ok_result, seed_measurement

GPU = H200.name


@pytest.fixture
def store() -> Iterator[Store]:
    with Store.from_url("sqlite://") as s:
        yield s


def _seed_varlen(
    store: Store,
    lens: tuple[int, ...],
    config: Any,
    ms: float = 1.0,
    *,
    d: int = 128,
    heads: int = 16,
    kv_heads: int = 16,
    causal: bool = False,
) -> None:
    problem = Problem.varlen(GPU, d, lens, heads=heads, kv_heads=kv_heads, dtype="fp16",
                             causal=causal)  # fmt: skip
    seed_measurement(store, problem=problem, config=config, result=ok_result(ms, problem))


def _call(count: int, mean: int, *, cc: str = "9.0", d: int = 128, **kw: Any) -> Call:
    """A packed call of ``count`` sequences of mean length ``mean`` (16 heads)."""
    packed = Packed(count, mean)
    fields: dict[str, Any] = dict(
        device=0, gpu=GPU, sm_count=132, compute_capability=cc, dtype="fp16", causal=False,
        d=d, shape=packed.shape(16, 16), packed=packed,
    )  # fmt: skip
    fields.update(kw)
    return Call(**fields)


def choose_varlen_config(store: Store | None, call: Call) -> Choice:
    assert call.packed is not None  # these tests ask for packed calls only
    return choose(store, call)


def varlen_reason(*, device_type: str, dtype: str, d: int) -> str | None:
    return call_reason(device_type=device_type, dtype=dtype, d=d, packed=True)


def _vl(config: Any) -> Any:
    return replace(config, varlen=True)


# --- the decision key -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "count", "bucket"),
    [(0, 4, 1), (3, 4, 1), (4, 4, 1), (10, 4, 2), (12, 4, 4), (5, 1, 4), (6, 1, 8),
     (1000, 1, 1024), (1448, 1, 1024), (1449, 1, 2048), (4096 * 8, 8, 4096)],
)  # fmt: skip
def test_mean_bucket_is_the_nearest_power_of_two_by_ratio(
    total: int, count: int, bucket: int
) -> None:
    assert mean_bucket(total, count) == bucket


def test_decision_key_groups_batches_of_one_bucket() -> None:
    def key(total: int, count: int = 8, causal: bool = True, max_q: int = 900) -> object:
        return decision_key("cuda:0", "fp16", 128, 32, 8, causal, count, total, max_q)

    assert key(8 * 800) == key(8 * 1000) == key(8 * 1400)  # means 800..1400 -> 1024
    assert key(8 * 800) != key(8 * 1500)  # -> 2048
    assert key(8 * 1000) != key(8 * 1000, count=9)  # the number of sequences is exact
    assert key(8 * 1000) != key(8 * 1000, causal=False)
    # One query row per sequence (decode): causal is served unmasked, as for dense calls.
    assert key(8, max_q=1) == key(8, causal=False, max_q=1)
    assert effective_varlen_causal(True, 1) is False
    assert effective_varlen_causal(True, 2) is True
    assert effective_varlen_causal(False, 5) is False


# --- argument checks ---------------------------------------------------------------------

GOOD = ((100, 8, 64), (120, 2, 64), (120, 2, 64), (4,), (4,), 50, 60)


def _shapes(**kw: Any) -> tuple[Any, ...]:
    names = ("q", "k", "v", "cu_q", "cu_k", "max_q", "max_k")
    given = dict(zip(names, GOOD, strict=True))
    given.update(kw)
    return tuple(given[n] for n in names)


def test_good_shapes_pass() -> None:
    check_varlen_shapes(*GOOD)
    check_varlen_shapes(*_shapes(q=(0, 8, 64), max_q=0))  # an empty batch of queries
    check_varlen_shapes(*_shapes(k=(0, 2, 64), v=(0, 2, 64), max_k=0))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"q": (1, 100, 8, 64)}, "3-d packed"),
        ({"k": (120, 64)}, "3-d packed"),
        ({"v": (120, 4, 64)}, "k shape .* != v shape"),
        ({"k": (120, 3, 64), "v": (120, 3, 64)}, "q heads a multiple of kv heads"),
        ({"k": (120, 2, 32), "v": (120, 2, 32)}, "same head dim"),
        ({"cu_q": (4, 1)}, "cu_seqlens_q must be 1-d"),
        ({"cu_k": (1,)}, "cu_seqlens_k must be 1-d with num_seqs \\+ 1 >= 2"),
        ({"cu_k": (5,)}, "cu_seqlens_q has 4 entries but cu_seqlens_k 5"),
        ({"max_q": -1}, "negative"),
        ({"max_q": 0}, "max_seqlen_q is 0 but q has 100 rows"),
        ({"q": (2**31, 8, 64)}, "int32 offsets"),
    ],
)
def test_bad_shapes_raise_value_error(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_varlen_shapes(*_shapes(**changes))


def test_fallback_reasons() -> None:
    assert varlen_reason(device_type="cuda", dtype="float16", d=128) is None
    assert varlen_reason(device_type="cuda", dtype="bfloat16", d=40) is None
    assert "cpu" in (varlen_reason(device_type="cpu", dtype="float16", d=128) or "")
    assert "float32" in (varlen_reason(device_type="cuda", dtype="float32", d=128) or "")
    assert "head dim 264" in (varlen_reason(device_type="cuda", dtype="float16", d=264) or "")
    assert "head dim 12" in (varlen_reason(device_type="cuda", dtype="float16", d=12) or "")


# --- the choice ---------------------------------------------------------------------------


def test_nothing_tuned_serves_the_fa2_default_twin(store: Store) -> None:
    for d in (64, 128, 40, 256):
        choice = choose_varlen_config(store, _call(8, 1024, d=d, causal=True))
        assert choice.source == "default"
        assert choice.config == replace(fa2_default_config(d, "fp16", True), varlen=True)
        assert choice.config.name.endswith("_vl")
    assert default_varlen_config(64, "bf16", False).varlen
    assert choose_varlen_config(None, _call(8, 1024)).source == "default"


def test_dense_results_never_serve_a_varlen_call(store: Store) -> None:
    problem = Problem(gpu=GPU, d=128, n=1024, batch=8, heads=16, dtype="fp16", causal=False)
    seed_measurement(store, problem=problem, config=make_config(br=64, bc=64),
                     result=ok_result(0.1, problem))  # fmt: skip
    assert choose_varlen_config(store, _call(8, 1024)).source == "default"


def test_nearest_tuned_varlen_problem_by_count_and_mean(store: Store) -> None:
    short = _vl(make_config(br=64, bc=64))
    long = _vl(make_config(br=128, bc=64, swizzle=True))
    _seed_varlen(store, (100, 130, 90, 80), short)  # 4 x ~100
    _seed_varlen(store, (4000, 3000, 5000, 4000), long)  # 4 x 4000
    near_short = choose_varlen_config(store, _call(4, 128))
    assert near_short.source == "nearest" and near_short.config == short
    assert near_short.measured == Shape(100, 100, 4, 16, 16)
    near_long = choose_varlen_config(store, _call(4, 4096))
    assert near_long.config == long and near_long.measured == Shape(4000, 4000, 4, 16, 16)
    call = _call(4, 4096)
    assert "packed 4 sequences" in call.describe(near_long.describe(call.shape), "bnhd")
    # Other head dim, dtype or mask: nothing tuned there.
    assert choose_varlen_config(store, _call(4, 128, d=64)).source == "default"
    assert choose_varlen_config(store, _call(4, 128, causal=True)).source == "default"
    assert choose_varlen_config(store, _call(4, 128, dtype="bf16")).source == "default"


def test_a_tuned_fa3_config_serves_only_compute_capability_9_0(store: Store) -> None:
    fa3 = _vl(fa3_default(128, "fp16", False))
    _seed_varlen(store, (1000, 17, 255, 3), fa3)
    hopper = choose_varlen_config(store, _call(4, 256))
    assert hopper.source == "nearest" and hopper.config == fa3
    ampere = choose_varlen_config(store, _call(4, 256, cc="8.0"))
    assert ampere.source == "default" and ampere.config.family == "fa2"


def test_unsupported_calls_raise(store: Store) -> None:
    with pytest.raises(Unsupported, match="head dim 12"):
        choose_varlen_config(store, _call(4, 256, d=12))
    with pytest.raises(Unsupported, match=r"compute capability 7\.5"):
        choose_varlen_config(store, _call(4, 256, cc="7.5"))
    with pytest.raises(Unsupported, match="fp32"):
        choose_varlen_config(store, _call(4, 256, dtype="fp32"))


def test_a_broken_store_gives_the_default(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def candidate_set(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("database is locked")

    with caplog.at_level(logging.WARNING):
        choice = choose_varlen_config(Broken(), _call(4, 256))  # type: ignore[arg-type]
    assert choice.source == "default"
    assert "database is locked" in caplog.text


def test_off_mode_never_opens_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from fa2tune.ops import selection

    def no_store() -> None:
        raise AssertionError("off mode opened the store")

    monkeypatch.setattr(selection, "open_store", no_store)
    autotune.reset()
    try:
        autotune.autotune("off", 5)
        assert select(_call(4, 256)).choice.source == "default"
    finally:
        autotune.reset()


def test_store_best_varlen_shape(store: Store) -> None:
    cfg = _vl(make_config(br=64, bc=64))
    assert store.best_varlen_shape(GPU, 128, "fp16", False, 4, 100, 16, 16) is None
    _seed_varlen(store, (100, 130, 90, 80), cfg)
    found = store.best_varlen_shape(GPU, 128, "fp16", False, 4, 100, 16, 16)
    assert found is not None
    best, lens = found
    assert lens == (100, 130, 90, 80) and best.config == cfg and not best.exact
    # Same rule as best_varlen's nearest (the asked batch as count x mean).
    assert store.best_varlen(GPU, 128, "fp16", False, (1, 2, 3), 16, 16) is not None
    with pytest.raises(ValueError, match="0 sequences"):
        store.best_varlen_shape(GPU, 128, "fp16", False, 0, 100, 16, 16)
    assert isinstance(cfg, Fa2Config)


def test_a_packed_call_asks_only_the_local_results(
    store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """select serves both modes; a packed batch asks neither the service nor first-use
    tuning (both take whole length lists), only the local results."""
    from core import settings as settings_module
    from core.settings import override_settings
    from fa2tune.ops import selection

    def no_service(*_: object) -> None:
        raise AssertionError("a packed call asked the service")

    def no_tuning(*_: object) -> bool:
        raise AssertionError("a packed call started a tuning job")

    cfg = _vl(make_config(br=64, bc=64))
    _seed_varlen(store, (100, 130, 90, 80), cfg)
    monkeypatch.setattr(selection, "service_choice", no_service)
    monkeypatch.setattr(selection, "open_store", lambda: store)
    saved = dict(settings_module._overrides)
    override_settings(service_url="http://127.0.0.1:9", cache_dir=tmp_path / "build")
    autotune.reset()
    try:
        autotune.autotune("on_first_call", 5)
        monkeypatch.setattr(autotune.current(), "consider", no_tuning)
        selected = select(_call(4, 128))
    finally:
        autotune.reset()
        settings_module._overrides.clear()
        settings_module._overrides.update(saved)
    assert (selected.choice.source, selected.choice.config) == ("nearest", cfg)
    assert not selected.tuning
