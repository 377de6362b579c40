"""Packed variable-length problems in the store, the campaign's space and results files."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.fa2_config import Fa2Config
from core.problem import Problem
from core.shape import varlen_shape
from db.store import Store
from db.transfer import dump, ingest_file
from tests.support.factories import H200, make_config, make_report, ok_result

LENS = (100, 4000, 1822, 7)


def _varlen(lens: tuple[int, ...] = LENS, **kw: object) -> Problem:
    return Problem.varlen(H200.name, 128, lens, heads=32, kv_heads=8, **kw)  # type: ignore[arg-type]


def _record(store: Store, problem: Problem, config: Fa2Config, ms: float) -> int:
    gpu = store.upsert_gpu(H200)
    pid = store.problem_id(problem, gpu)
    build = store.record_build(make_report(config))
    store.record_measurement(pid, build, ok_result(ms, problem), H200)
    return pid


def test_problem_rules() -> None:
    p = _varlen()
    assert (p.n, p.batch, p.nk, p.is_varlen) == (4000, 4, None, True)
    assert p.flops == sum(4.0 * 32 * n * n * 128 for n in LENS)
    with pytest.raises(ValueError, match="n = the longest"):
        Problem(gpu="g", d=128, n=100, batch=4, seqlens=LENS)
    with pytest.raises(ValueError, match=">= 1"):
        Problem.varlen("g", 128, (3, 0))
    assert Problem.from_dict(p.to_dict()) == p


def test_varlen_rows_never_answer_dense_queries(store: Store) -> None:
    vl = make_config(causal=False, swizzle=True)
    _record(store, _varlen(), Fa2Config(**{**vl.to_dict(), "varlen": True}), 2.0)
    # The row keeps max/count/total in n/batch/nk: dense lookups at those numbers find nothing.
    assert store.best(H200.name, 128, 4000, "fp16", False, nk=sum(LENS), batch=4) is None
    assert store.best_or_nearest(H200.name, 128, 4000, "fp16", False) is None
    assert all(r.config.name.endswith("_vl") is False for r, _ in store.shape_winners())


def test_best_varlen_exact_then_nearest(store: Store) -> None:
    fast = Fa2Config(**{**make_config(swizzle=True).to_dict(), "varlen": True})
    slow = Fa2Config(**{**make_config(br=64).to_dict(), "varlen": True})
    _record(store, _varlen(), slow, 3.0)
    _record(store, _varlen(), fast, 2.0)
    other = (50, 60, 70)
    _record(store, _varlen(other), slow, 0.1)

    hit = store.best_varlen(H200.name, 128, "fp16", False, LENS, 32, 8)
    assert hit is not None
    best, measured = hit
    assert (best.config, best.exact, best.distance, measured) == (fast, True, 0.0, LENS)

    # Lengths never tuned: the varlen problem nearest by count at mean length answers.
    near = store.best_varlen(H200.name, 128, "fp16", False, (90, 2500, 2000, 30), 32, 8)
    assert near is not None and near[1] == LENS and not near[0].exact and near[0].distance > 0
    small = store.best_varlen(H200.name, 128, "fp16", False, (40, 80), 32, 8)
    assert small is not None and small[1] == other
    assert store.best_varlen(H200.name, 64, "fp16", False, LENS, 32, 8) is None
    assert store.best_varlen(H200.name, 128, "fp16", True, LENS, 32, 8) is None


def test_a_colliding_length_list_is_refused_with_a_message(store: Store) -> None:
    _record(store, _varlen((1, 5, 6)), make_config(), 1.0)
    gpu = store.upsert_gpu(H200)
    with pytest.raises(ValueError, match="one length list per such triple"):
        store.problem_id(_varlen((2, 4, 6)), gpu)  # same count, longest and total


def test_results_files_carry_the_lengths(store: Store, tmp_path: Path, db_url: str) -> None:
    cfg = Fa2Config(**{**make_config(swizzle=True).to_dict(), "varlen": True})
    _record(store, _varlen(), cfg, 2.0)
    _record(store, Problem(gpu=H200.name, d=128, n=4000, batch=4, heads=32, kv_heads=8),
            make_config(swizzle=True), 1.5)  # fmt: skip
    data = dump(store, tmp_path / "r.json")
    packed = [p for p in data.problems if p.seqlens is not None]
    assert [(p.seqlens, p.n, p.batch, p.nk) for p in packed] == [(list(LENS), 4000, 4, sum(LENS))]
    fresh = tmp_path / "fresh.db"
    with Store.from_url(f"sqlite:///{fresh}") as again:
        ingest_file(again, tmp_path / "r.json")
        hit = again.best_varlen(H200.name, 128, "fp16", False, LENS, 32, 8)
        assert hit is not None and hit[0].config == cfg and hit[1] == LENS
        dense = again.best(H200.name, 128, 4000, "fp16", False, batch=4)
        assert dense is not None and not dense.config.name.endswith("_vl")


def test_varlen_shape_is_the_count_at_the_mean_length() -> None:
    assert varlen_shape(LENS, 32, 8) == varlen_shape((1482,) * 4, 32, 8)
    assert varlen_shape((1, 2), 4, 4).nq == 2  # rounds half up... never below 1


def test_campaign_space_for_a_varlen_problem_is_varlen_only() -> None:
    from tuner.campaign import _defaults

    space_fn, seeds_fn, _ = _defaults("sm_90", H200, None, None, None)
    configs = space_fn(_varlen())
    # fa2's varlen kernels, and on sm_90 the Hopper family's (tests/families/fa3/test_varlen.py).
    assert configs and all(getattr(c, "varlen", False) for c in configs)
    assert {c.family for c in configs} == {"fa2", "fa3"}
    assert any(isinstance(c, Fa2Config) for c in configs)
    seeds = seeds_fn(_varlen())
    assert seeds and all(c.varlen and c in configs for c in seeds)  # type: ignore[union-attr]
    dense = Problem(gpu=H200.name, d=128, n=4000, batch=4, heads=32, kv_heads=8)
    assert not any(getattr(c, "varlen", False) for c in space_fn(dense))
