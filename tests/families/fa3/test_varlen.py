"""Packed variable-length batches on the Hopper family (fa3 ``_vl`` configs), without a GPU.

Names, parameters and the store's columns round-trip; the dense configs' names, parameters,
rendered sources and Traits stay exactly what they were (shipped builds and stored results
name them); the space and seeds have varlen twins; a campaign's varlen problem searches fa3's
twins beside fa2's where fa3 runs; the varlen launch takes FaVarlen's bytes, then the three
descriptors over the packed tensors. The GPU half is in tests/test_gpu_varlen.py, the nvcc
builds in tests/test_fa3_compile.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from codegen.families import FA3, family
from codegen.families.fa3 import space as fa3_space
from codegen.render import template_dir
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.family import config_from_name, config_from_params
from core.problem import Problem
from tests.support.factories import H200

DENSE = Fa3Config(128, "fp16", True)
VARLEN = replace(DENSE, varlen=True)


def test_varlen_name_round_trips() -> None:
    assert VARLEN.name == "fa3_d128_fp16_causal_m128_n128_s2_rs_ov_pp_r240_vl"
    assert Fa3Config.from_name(VARLEN.name) == VARLEN
    assert config_from_name(VARLEN.name) == VARLEN
    assert VARLEN.key != DENSE.key
    assert "packed sequences" in VARLEN.describe()
    assert "packed" not in DENSE.describe()
    with pytest.raises(ValueError):
        Fa3Config.from_name(VARLEN.name + "_vl")


def test_varlen_params_and_dict_round_trip() -> None:
    params = VARLEN.params()
    assert params["varlen"] is True
    assert config_from_params("fa3", 128, "fp16", True, params) == VARLEN
    assert Fa3Config.from_dict(VARLEN.to_dict()) == VARLEN
    # A dense config's stored parameters have no varlen; they still rebuild the config.
    assert config_from_params("fa3", 128, "fp16", True, DENSE.params()) == DENSE
    assert Fa3Config.from_dict({**DENSE.to_dict(), "varlen": False}) == DENSE
    old = {k: v for k, v in DENSE.to_dict().items() if k != "varlen"}
    assert Fa3Config.from_dict(old) == DENSE


def test_dense_names_params_and_sources_are_unchanged() -> None:
    """Every dense fa3 name, parameter set, rendered source and Traits as before varlen."""
    d64 = Fa3Config(64, "bf16", False, 192, 128, 2, False, True, False, 160)
    assert DENSE.name == "fa3_d128_fp16_causal_m128_n128_s2_rs_ov_pp_r240"
    assert d64.name == "fa3_d64_bf16_full_m192_n128_s2_ss_ov_r160"
    assert DENSE.params() == {
        "block_m": 128, "block_n": 128, "stages": 2, "pv_regs": True, "overlap": True,
        "pingpong": True, "consumer_regs": 240,
    }  # fmt: skip
    assert FA3.render(DENSE) == (
        '#include "fa3_fwd.cuh"\n'
        "FA3_DEFINE_KERNEL(fa3_d128_fp16_causal_m128_n128_s2_rs_ov_pp_r240, 128, __half, true, "
        "128, 128, 2, true, true, true, 240)\n"
    )
    assert FA3.render(d64) == (
        '#include "fa3_fwd.cuh"\n'
        "FA3_DEFINE_KERNEL(fa3_d64_bf16_full_m192_n128_s2_ss_ov_r160, 64, __nv_bfloat16, "
        "false, 192, 128, 2, false, true, false, 160)\n"
    )
    assert (
        FA3.header.traits(DENSE)
        == "fa3::Traits<128, __half, true, 128, 128, 2, true, true, true, 240>"
    )
    for d in fa3_space.HEAD_DIMS:
        for cfg in fa3_space.seed_configs(d, "fp16", False):
            assert not cfg.varlen and not cfg.name.endswith("_vl")
            assert "varlen" not in cfg.params()
            assert "VARLEN" not in FA3.render(cfg) and "true>" not in FA3.header.traits(cfg)[-6:]


def test_varlen_render_uses_the_varlen_kernel() -> None:
    text = FA3.render(VARLEN)
    assert text.startswith('#include "fa3_fwd.cuh"\nFA3_DEFINE_VARLEN_KERNEL(' + VARLEN.name)
    assert text.replace("FA3_DEFINE_VARLEN_KERNEL", "FA3_DEFINE_KERNEL").replace(
        VARLEN.name, DENSE.name
    ) == FA3.render(DENSE)
    assert FA3.header.traits(VARLEN) == FA3.header.traits(DENSE)[:-1] + ", true>"
    source = (template_dir() / "fa3_fwd.cuh").read_text()
    assert "#define FA3_DEFINE_VARLEN_KERNEL(" in source
    # FaVarlen's bytes come second, before the descriptors (the loader's packed mode binds so).
    assert "NAME(const FaParams p, const fa3::VarlenArgs vl," in source


def test_space_and_seeds_have_varlen_twins() -> None:
    for d in (64, 128):
        for causal in (False, True):
            dense = fa3_space.enumerate_space(d, "bf16", causal)
            twins = fa3_space.enumerate_space(d, "bf16", causal, varlen=True)
            # Every dense config but the longest-first ones (dense causal only) has its twin.
            assert twins == sorted(replace(c, varlen=True) for c in dense if not c.longest_first)
            seeds = fa3_space.seed_configs(d, "bf16", causal, varlen=True)
            dense_seeds = fa3_space.seed_configs(d, "bf16", causal)
            assert seeds == sorted(
                replace(c, varlen=True) for c in dense_seeds if not c.longest_first
            )
            assert all(c.varlen and fa3_space.is_valid(c)[0] for c in seeds)
            assert all(family("fa3").check(c, 227 * 1024)[0] for c in seeds)


def _varlen_problem(d: int = 128, causal: bool = False) -> Problem:
    return Problem.varlen(H200.name, d, (100, 4000, 1822, 7), heads=32, kv_heads=8,
                          causal=causal)  # fmt: skip


def test_campaign_varlen_problem_searches_fa2_and_fa3_twins_on_sm90() -> None:
    from codegen.families.fa2.space import enumerate_space, seed_configs
    from tuner.campaign import _defaults

    space_fn, seeds_fn, _ = _defaults("sm_90", H200, None, None, None)
    p = _varlen_problem(causal=True)
    configs = list(space_fn(p))
    assert all(getattr(c, "varlen", False) for c in configs)
    fa2 = [c for c in configs if isinstance(c, Fa2Config)]
    fa3 = [c for c in configs if isinstance(c, Fa3Config)]
    assert len(fa2) + len(fa3) == len(configs)
    dense_fa2 = enumerate_space(128, "fp16", True, 227 * 1024, "sm_90")
    assert fa2 == [replace(c, varlen=True) for c in dense_fa2]
    assert fa3 == fa3_space.enumerate_space(128, "fp16", True, varlen=True)
    seeds = list(seeds_fn(p))
    assert {c.family for c in seeds[:2]} == {"fa2", "fa3"}  # each family's default first
    assert set(seeds) == {
        *seed_configs(128, "fp16", True, varlen=True),
        *fa3_space.seed_configs(128, "fp16", True, varlen=True),
    }
    assert seeds[1] == replace(fa3_space.default_config(128, "fp16", True), varlen=True)
    # Only fa3 asked for: its twins alone; a dense problem keeps the dense configs.
    only = _defaults("sm_90", H200, None, None, None, ("fa3",))[0]
    assert list(only(p)) == fa3
    dense = Problem(gpu=H200.name, d=128, n=4000, batch=4, heads=32, kv_heads=8)
    assert not any(getattr(c, "varlen", False) for c in space_fn(dense))


def test_campaign_varlen_problem_is_fa2_only_where_fa3_does_not_run() -> None:
    from tuner.campaign import _defaults

    ada = _defaults("sm_89", H200, None, None, None)
    configs = list(ada[0](_varlen_problem()))
    assert configs and all(isinstance(c, Fa2Config) and c.varlen for c in configs)
    # A head dim fa3 has no instantiation for: fa2's twins only, on sm_90 as well.
    d40 = list(_defaults("sm_90", H200, None, None, None)[0](_varlen_problem(d=40)))
    assert d40 and all(isinstance(c, Fa2Config) and c.varlen for c in d40)


def test_split_kv_stays_off_varlen_problems() -> None:
    from codegen.families import FAMILIES
    from tuner.campaign import _as_varlen

    assert {"fa2", "fa3"} == {f.name for f in FAMILIES.values() if f.varlen}
    from codegen.families.splitkv import space as splitkv_space

    skv = splitkv_space.seed_configs(128, "fp16", False)
    assert _as_varlen([*skv, DENSE]) == [VARLEN]
