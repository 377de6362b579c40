"""One declaration per family parameter: what is derived from it is what the hand-written code
gave before (issue 22).

``data/families_before.json`` was written once by ``make_before_fixture.py`` against the tree
before the declarations: for every config of the shipped results (read through the product's
dump reader) and for a sample of every family's space, the name, key, stored parameters, dict
form, optuna parameters, rendered ``.cu`` text, C++ ``Traits``, launch grids and more. Stored
studies, db rows and shipped results depend on these staying the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codegen.families import FAMILIES, family_of
from core.family import config_from_name, config_from_params
from db.dump_format import load_dump
from tests.families.make_before_fixture import GROUPS, describe, digest
from tuner import search

ROOT = Path(__file__).resolve().parents[2]
BEFORE = json.loads((Path(__file__).parent / "data" / "families_before.json").read_text())


#: Shipped files written after the fixture (their configs are checked by their own tests:
#: the variants' in tests/db/test_shipped_variants.py and the variant tests; the fa3 fill's
#: are plain fa3 configs, the family's space sampled below and the shipped-results tests;
#: the KV-cache kernels' in tests/db/test_shipped_kvcache.py, test_shipped_kvcache_fa3.py and
#: test_shipped_kvcache_mixed.py).
AFTER_FIXTURE = {
    "h200_results_variants.json",
    "h200_results_fa3_fill.json",
    "h200_results_kvcache.json",
    "h200_results_kvcache_fa3.json",
    "h200_results_kvcache_mixed.json",
}


def _shipped_names() -> dict[str, list[str]]:
    """The configs of the shipped files the fixture was written from."""
    names: set[str] = set()
    for path in sorted((ROOT / "db" / "data").glob("*.json")):
        if path.name not in AFTER_FIXTURE:
            names |= {b.config_name for b in load_dump(path).builds}
    by_family: dict[str, list[str]] = {}
    for n in sorted(names):
        by_family.setdefault(n.split("_", 1)[0], []).append(n)
    return by_family


SHIPPED = _shipped_names()

#: Search parameters declared after the fixture, with the encoding every config of a dense
#: space has (the value each config the fixture describes takes): split-KV's capacity
#: splits (``cap_split``, searched on KV-cache problems only).
AFTER_FIXTURE_SEARCH = {"skv_span": "length"}


def _without_later_search(entry: dict[str, object]) -> dict[str, object]:
    """A describe() entry as the fixture's code would have written it: the search
    parameters declared later checked at their old value and left out."""
    found = dict(entry["search"])  # type: ignore[call-overload]
    for name, value in AFTER_FIXTURE_SEARCH.items():
        if name in found:
            assert found.pop(name) == value, entry["name"]
    return {**entry, "search": found}


def test_every_family_of_the_shipped_results_is_in_the_fixture() -> None:
    assert set(SHIPPED) == set(BEFORE["configs"]) == {"fa2", "fa3", "splitkv"}
    assert {f: len(n) for f, n in SHIPPED.items()} == {
        f: e["count"] for f, e in BEFORE["configs"].items()
    }


@pytest.mark.parametrize("family", ["fa2", "fa3", "splitkv"])
def test_shipped_configs_derive_what_the_old_code_gave(family: str) -> None:
    entries = [_without_later_search(describe(n)) for n in SHIPPED[family]]
    before = BEFORE["configs"][family]
    # The first few in full (a readable diff), then all of them by digest.
    assert json.loads(json.dumps(entries[: len(before["first"])])) == before["first"]
    assert digest(entries) == before["digest"]


@pytest.mark.parametrize("family", ["fa2", "fa3", "splitkv"])
def test_shipped_names_round_trip_through_name_and_stored_columns(family: str) -> None:
    for name in SHIPPED[family]:
        c = config_from_name(name)
        assert c.name == name
        assert config_from_params(c.family, c.d, c.dtype, c.causal, c.params()) == c
        assert type(c).from_dict(c.to_dict()) == c


@pytest.mark.parametrize("key", sorted(BEFORE["spaces"]))
def test_spaces_seeds_defaults_and_choices_are_unchanged(key: str) -> None:
    name, d, dtype, causal = key.split("/")
    group = (int(d), dtype, causal == "True")
    assert group in GROUPS
    fam = FAMILIES[name]
    before = BEFORE["spaces"][key]
    space = fam.space(*group, 227 * 1024, fam.arch_for("9.0") or "")  # type: ignore[arg-type]
    assert len(space) == before["count"]
    assert digest([{"name": c.name} for c in space]) == before["space"]
    assert [c.name for c in fam.seeds(*group)] == before["seeds"]  # type: ignore[arg-type]
    if space:
        assert fam.default(*group).name == before["default"]  # type: ignore[arg-type]
        choices = {k: list(v) for k, v in search.SearchSpace.from_configs(space).choices.items()}
        for later, value in AFTER_FIXTURE_SEARCH.items():
            if later in choices:
                assert choices.pop(later) == [value]  # a dense space: one value
        assert choices == before["choices"]
        entries = [_without_later_search(describe(c.name)) for c in space]
        assert digest(entries) == before["digest"]


def test_added_search_parameters_keep_their_old_default() -> None:
    assert BEFORE["added"] == {"fa3_order": "per_head"}
    assert search.added_param_defaults() == {**BEFORE["added"], **AFTER_FIXTURE_SEARCH}


def test_every_family_draws_its_declared_parameters_in_the_stored_order() -> None:
    assert {f.name: f.search_names for f in FAMILIES.values()} == {
        "fa2": ("br", "bc", "rows_per_warp", "stages", "layout"),
        "fa3": (
            "fa3_block_m", "fa3_block_n", "fa3_stages", "fa3_pv", "fa3_overlap",
            "fa3_pingpong", "fa3_regs", "fa3_order",
        ),
        "splitkv": (
            "skv_rows", "skv_block_n", "skv_warps", "skv_stages", "skv_splits", "skv_span",
        ),
    }  # fmt: skip
    for f in FAMILIES.values():
        c = f.default(128, "fp16", True)
        assert tuple(family_of(c).search_params(c)) == f.search_names


def test_a_field_without_a_declaration_is_refused() -> None:
    from dataclasses import dataclass

    from core.config_common import FamilyConfigBase, family_config

    with pytest.raises(TypeError, match=r"Bad\.tile is not declared with param\(\)"):

        @family_config("bad", example="bad_d64_fp16_full")
        @dataclass(frozen=True, order=True)
        class Bad(FamilyConfigBase):
            tile: int = 64


def test_optional_parameters_stay_out_of_names_and_params_at_their_default() -> None:
    from core.fa3_config import Fa3Config

    c = Fa3Config(128, "fp16", True)
    assert c.name == "fa3_d128_fp16_causal_m128_n128_s2_rs_ov_pp_r240"
    assert "varlen" not in c.params() and "longest_first" not in c.params()
    assert Fa3Config.from_dict({k: v for k, v in c.to_dict().items() if k != "varlen"}) == c
    with pytest.raises(KeyError):  # a stored parameter, not optional: no default stands in
        Fa3Config.from_dict({k: v for k, v in c.to_dict().items() if k != "block_m"})


#: The hand-written name patterns before the declarations (commit 1e7373b), as they were.
OLD_PATTERNS = {
    "fa2": r"^fa2_d(?P<d>\d+)_(?P<dtype>fp16|bf16)_(?P<causal>causal|full)"
    r"_br(?P<br>\d+)_bc(?P<bc>\d+)_w(?P<warps>\d+)_s(?P<stages>\d+)"
    r"_(?:pad(?P<pad>\d+)|(?P<swz>swz))(?P<vl>_vl)?$",
    "fa3": r"^fa3_d(?P<d>\d+)_(?P<dtype>fp16|bf16)_(?P<causal>causal|full)"
    r"_m(?P<block_m>\d+)_n(?P<block_n>\d+)_s(?P<stages>\d+)"
    r"_(?P<pv>rs|ss)(?P<ov>_ov)?(?P<pp>_pp)?_r(?P<regs>\d+)(?P<lf>_lf)?(?P<vl>_vl)?$",
    "splitkv": r"^splitkv_d(?P<d>\d+)_(?P<dtype>fp16|bf16)_(?P<causal>causal|full)"
    r"_r(?P<rows>\d+)_n(?P<block_n>\d+)_w(?P<warps>\d+)_s(?P<stages>\d+)_k(?P<splits>\d+)$",
}


def _mutations(name: str) -> list[str]:
    parts = name.split("_")
    out = [name + "\n", name + "_x", name + "_vl", name[:-1], "X" + name]
    for i in range(1, len(parts)):
        out.append("_".join(parts[:i] + parts[i + 1 :]))  # a segment dropped
        out.append("_".join(parts[: i + 1] + parts[i:]))  # a segment doubled
        if i + 1 < len(parts):
            swapped = [*parts]
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            out.append("_".join(swapped))
        for word in ("swz", "pad8", "lf", "ov", "pp", "ss", "vl", "k4", "r16"):
            out.append("_".join([*parts[:i], word, *parts[i:]]))
    return out


@pytest.mark.parametrize("family", ["fa2", "fa3", "splitkv"])
def test_names_are_accepted_and_refused_as_the_old_patterns_did(family: str) -> None:
    import re

    old = re.compile(OLD_PATTERNS[family])
    cls = FAMILIES[family].config_type
    for name in SHIPPED[family][:: max(1, len(SHIPPED[family]) // 150)]:
        for candidate in _mutations(name):
            try:
                parsed = cls.from_name(candidate)
            except ValueError:
                parsed = None
            assert (parsed is not None) == (old.match(candidate) is not None), candidate
