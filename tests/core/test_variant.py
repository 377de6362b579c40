"""core.variant: validation, FlashAttention's normalisations, key text; a Problem's variant;
each family config's variant switches (names, dict forms, instantiation macro)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from codegen.families import declared, family_of
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.problem import Problem
from core.splitkv_config import SplitKvConfig
from core.variant import PLAIN, Variant, VariantError, normalize


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"window_left": -2}, "window_size"),
        ({"window_right": -5}, "window_size"),
        ({"chunk": -1}, "attention_chunk"),
        ({"softcap": -1.0}, "softcap"),
        ({"softcap": math.inf}, "softcap"),
        ({"softcap": math.nan}, "softcap"),
        ({"softcap": "50"}, "softcap"),
        ({"window_left": 1.5}, "window_left"),
        ({"window_left": True}, "window_left"),
        ({"sinks": 1}, "sinks"),
    ],
)
def test_bad_values_name_their_argument(kwargs: dict[str, object], word: str) -> None:
    with pytest.raises(VariantError, match=word):
        Variant(**kwargs)  # type: ignore[arg-type]


def test_switches_follow_the_values() -> None:
    assert PLAIN.plain and PLAIN.needs == {"local": False, "softcap": False, "sinks": False}
    assert Variant(window_left=128).needs["local"]
    assert Variant(chunk=8192).needs == {"local": True, "softcap": False, "sinks": False}
    assert Variant(softcap=50).needs == {"local": False, "softcap": True, "sinks": False}
    assert Variant(sinks=True).needs["sinks"] and not Variant(sinks=True).plain
    assert Variant(softcap=50).softcap == 50.0 and isinstance(Variant(softcap=50).softcap, float)


def test_key_text_names_window_chunk_and_switches_not_the_cap() -> None:
    assert PLAIN.key_text() == ""
    assert Variant(4096, 0).key_text() == "_wl4096_wr0"
    assert Variant(chunk=8192).key_text() == "_ch8192"
    assert Variant(128, 0, softcap=30.0, sinks=True).key_text() == "_wl128_wr0_cap_snk"
    assert Variant(softcap=30.0).key_text() == Variant(softcap=50.0).key_text()


def test_normalize_as_flashattention_does() -> None:
    # (-1, 0) is causal; causal forces right = 0; plain causal stays the causal mask alone.
    assert normalize(False, -1, 0) == (True, PLAIN)
    assert normalize(True, -1, -1) == (True, PLAIN)
    assert normalize(True, 100, 7) == (True, Variant(100, 0))
    assert normalize(False, 100, 0) == (True, Variant(100, 0))  # right 0 is causality
    assert normalize(True, -1, -1, 64) == (True, Variant(-1, 0, 64))
    # Bounds reaching past every key are none, given the lengths.
    assert normalize(False, 998, 999, nq=100, nk=1000) == (False, Variant(998, -1))
    assert normalize(False, 999, 99, nq=100, nk=1000) == (False, PLAIN)
    assert normalize(False, 1000, 50, nq=100, nk=1000) == (False, Variant(-1, 50))
    assert normalize(True, 5000, -1, nq=4096, nk=4096) == (True, PLAIN)
    # A chunk holding every key is none only when every query has a key position.
    assert normalize(False, chunk=4096, nq=100, nk=1000) == (False, PLAIN)
    assert normalize(False, chunk=4096, nq=1000, nk=100) == (False, Variant(chunk=4096))
    assert normalize(False, softcap=50.0, sinks=True)[1] == Variant(softcap=50.0, sinks=True)
    with pytest.raises(VariantError):
        normalize(False, -3, 0)


def test_a_problem_carries_its_variant_in_name_and_dict() -> None:
    plain = Problem("H200", 128, 4096, causal=True)
    windowed = replace(plain, variant=Variant(4096, 0))
    assert windowed.study_name == plain.study_name + "_wl4096_wr0"
    assert set(plain.to_dict()) == set(Problem.from_dict(plain.to_dict()).to_dict())
    assert "window_left" not in plain.to_dict()
    assert windowed.to_dict()["window_left"] == 4096
    assert Problem.from_dict(windowed.to_dict()) == windowed
    assert Problem.from_dict(plain.to_dict()) == plain
    with pytest.raises(ValueError, match="variant"):
        Problem("H200", 128, 4096, variant=(4096, 0))  # type: ignore[arg-type]


CONFIGS = [
    Fa2Config.from_name("fa2_d128_fp16_causal_br128_bc64_w4_s1_swz"),
    Fa3Config.from_name("fa3_d128_bf16_causal_m128_n128_s2_rs_ov_pp_r240"),
    SplitKvConfig.from_name("splitkv_d128_fp16_full_r16_n32_w4_s2_k16"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.family)
def test_switches_are_name_suffixes_and_stay_out_of_plain_forms(config: object) -> None:
    plain = config
    assert not plain.has_variant  # type: ignore[attr-defined]
    assert not {"local", "softcap", "sinks"} & set(plain.params())  # type: ignore[attr-defined]
    assert not {"local", "softcap", "sinks"} & set(plain.to_dict())  # type: ignore[attr-defined]
    every = replace(plain, local=True, softcap=True, sinks=True)  # type: ignore[type-var]
    assert every.name == plain.name + "_loc_cap_snk"  # type: ignore[attr-defined]
    assert type(plain).from_name(every.name) == every
    assert type(plain).from_dict(every.to_dict()) == every
    assert every.params()["softcap"] is True
    only = replace(plain, sinks=True)  # type: ignore[type-var]
    assert only.name.endswith("_snk") and only.variant_switches["sinks"]


def test_variant_configs_use_the_variant_macro_over_every_traits_argument() -> None:
    cfg = replace(CONFIGS[0], varlen=True, local=True)
    text = declared.instantiation(cfg, "fa2_fwd.cuh", "FA2_DEFINE_KERNEL", "V_MACRO")
    assert text.splitlines()[1] == (
        f"V_MACRO({cfg.name}, 128, __half, true, 128, 64, 4, 1, 0, true, true, true, false, false)"
    )
    with pytest.raises(ValueError, match="no variant kernels"):
        declared.instantiation(cfg, "fa2_fwd.cuh", "FA2_DEFINE_KERNEL")
    # A plain config's text is the family macro's, untouched by the switches.
    assert "FA2_DEFINE_KERNEL(" in family_of(CONFIGS[0]).render(CONFIGS[0])


def test_a_switch_a_family_lacks_is_a_reason() -> None:
    cfg = replace(CONFIGS[2], softcap=True)
    assert declared.variant_reasons(cfg, ()) == ["the splitkv family has no softcap kernels"]
    assert declared.variant_reasons(cfg, ("local", "softcap", "sinks")) == []
