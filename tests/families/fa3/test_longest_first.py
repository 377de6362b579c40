"""The Hopper family's longest-first launch order (``_lf`` configs, dense causal only).

CPU: names, parameters, the space and seeds, the rendered kernel and header alias, the search
parameter and a study stored before it existed. ``compile``: the ``_lf`` seeds build for
sm_90a like their twins, and the template refuses ``_lf`` outside dense causal configs.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.build import build_configs
from codegen.families import family
from codegen.families.fa3 import space as fa3_space
from core.build_report import BuildStatus
from core.fa3_config import Fa3Config
from core.settings import get_settings
from tuner import search

CAUSAL = Fa3Config(128, "fp16", True)
LF = replace(CAUSAL, longest_first=True)


def test_name_params_and_dict_round_trip() -> None:
    assert LF.name == CAUSAL.name + "_lf"
    assert Fa3Config.from_name(LF.name) == LF
    assert Fa3Config.from_dict(LF.to_dict()) == LF
    assert LF.params()["longest_first"] is True
    # Configs without it keep the parameters (and so the stored rows) they had.
    assert "longest_first" not in CAUSAL.params()
    assert Fa3Config.from_dict({k: v for k, v in CAUSAL.to_dict().items()
                                if k != "longest_first"}) == CAUSAL  # fmt: skip
    assert "longest first across heads" in LF.describe()


def test_only_dense_causal_configs_may_launch_longest_first() -> None:
    assert fa3_space.is_valid(LF)[0]
    full = replace(LF, causal=False)
    assert any("causal" in why for why in fa3_space.invalid_reasons(full))
    packed = replace(LF, varlen=True)
    assert any("dense" in why for why in fa3_space.invalid_reasons(packed))


@pytest.mark.parametrize("d", fa3_space.HEAD_DIMS)
def test_space_and_seeds(d: int) -> None:
    causal = fa3_space.enumerate_space(d, "bf16", True)
    per_head = [c for c in causal if not c.longest_first]
    assert sorted(replace(c, longest_first=True) for c in per_head) == [
        c for c in causal if c.longest_first
    ]
    assert per_head and not any(c.longest_first for c in fa3_space.enumerate_space(d, "bf16"))
    assert not any(c.longest_first for c in fa3_space.enumerate_space(d, "bf16", True,
                                                                      varlen=True))  # fmt: skip
    default = fa3_space.default_config(d, "bf16", True)
    seeds = fa3_space.seed_configs(d, "bf16", True)
    assert default in seeds and replace(default, longest_first=True) in seeds
    assert not any(c.longest_first for c in fa3_space.seed_configs(d, "bf16", False))


def test_render_and_header_alias() -> None:
    fa3 = family("fa3")
    assert "FA3_DEFINE_LONGEST_FIRST_KERNEL(" + LF.name + "," in fa3.render(LF)
    assert "FA3_DEFINE_KERNEL(" + CAUSAL.name + "," in fa3.render(CAUSAL)
    plain = fa3.header.traits(CAUSAL)
    assert plain == "fa3::Traits<128, __half, true, 128, 128, 2, true, true, true, 240>"
    assert fa3.header.traits(LF) == plain[:-1] + ", false, true>"


def test_search_parameter_and_a_study_stored_before_it() -> None:
    space = search.SearchSpace.from_configs(fa3_space.enumerate_space(128, "fp16", True))
    assert space.choices["fa3_order"] == ("longest_first", "per_head")
    assert space.lookup(space.params_for(LF)) == LF
    assert space.lookup(space.params_for(CAUSAL)) == CAUSAL
    # A study created before the parameter: its stored choices lack it, and it keeps the
    # configs it could propose then (the per-head order), not none of the family.
    stored = {k: list(v) for k, v in space.choices.items() if k != "fa3_order"}
    resumed = space.with_choices(stored)
    assert len(resumed) == len(space) // 2
    assert all(not c.longest_first for c in resumed.configs)  # type: ignore[union-attr]
    assert resumed.lookup(resumed.params_for(CAUSAL)) == CAUSAL


# ------------------------------------------------------------------------------ nvcc

NVCC = get_settings().nvcc


@pytest.mark.compile
@pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH")
def test_longest_first_seeds_build_like_their_twins(tmp_path: Path) -> None:
    """The `_lf` seeds of D=128 (fp16): sm_90a builds with their twin's registers and spill
    status (the order is a few integer operations before the pipeline starts)."""
    pairs = [
        (c, replace(c, longest_first=False))
        for c in fa3_space.seed_configs(128, "fp16", True)
        if c.longest_first
    ]
    assert pairs
    reports = {
        r.config: r
        for r in build_configs([c for p in pairs for c in p], "sm_90", cache_dir=tmp_path, jobs=2)
    }
    for lf, twin in pairs:
        r, rt = reports[lf], reports[twin]
        assert r.status == rt.status == BuildStatus.OK, (r, rt)
        assert r.spill_stores + r.spill_loads == 0
        assert r.cubin is not None and lf.name.encode() in r.cubin.read_bytes()


@pytest.mark.compile
@pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH")
def test_template_refuses_longest_first_outside_dense_causal(tmp_path: Path) -> None:
    from tests.support.nvcc import compile_fa3_harness

    full = replace(LF, causal=False)
    assert fa3_space.invalid_reasons(full)
    ok, log = compile_fa3_harness(family("fa3").render(full), "fa3_lf_full", tmp_path)
    assert not ok
    assert "longest-first order is for dense causal configs" in log


def test_a_longest_first_winner_through_store_dump_ingest_and_best(tmp_path: Path) -> None:
    """An `_lf` measurement is stored, dumped, ingested elsewhere and answered by /v1/best
    with its parameter (the generic params path; no migration: `longest_first` is left out
    of the params of every other config, as `varlen` is)."""
    from fastapi.testclient import TestClient

    from core.problem import Problem
    from db.transfer import export, ingest
    from service.main import create_app
    from tests.support.factories import H200, ok_result, seed_measurement
    from tests.support.service_data import make_store

    problem = Problem(gpu=H200.name, d=128, n=2048, batch=1, heads=32, kv_heads=8,
                      dtype="fp16", causal=True)  # fmt: skip
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with make_store(tmp_path / "a") as source, make_store(tmp_path / "b") as target:
        seed_measurement(source, problem=problem, config=CAUSAL, result=ok_result(0.09, problem))
        seed_measurement(source, problem=problem, config=LF, result=ok_result(0.08, problem))
        ingest(target, export(source))
        with TestClient(create_app(target)) as client:
            params = {"gpu": H200.name, "d": 128, "dtype": "fp16", "causal": True, "batch": 1,
                      "heads": 32, "kv_heads": 8, "nq": 2048, "nk": 2048}  # fmt: skip
            body = client.get("/v1/best", params=params).json()
    assert body["config"]["name"] == LF.name and body["exact"] is True
    assert body["config"]["params"]["longest_first"] is True
