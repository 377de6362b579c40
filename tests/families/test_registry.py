"""What each built-in family's registry entry gives the stages (issue 22: complete plug-ins):
the capabilities the stages used to branch on by name or config type."""

from __future__ import annotations

from dataclasses import replace

from codegen.families import FAMILIES, family
from codegen.families.fa2 import space as fa2_space
from codegen.families.fa3 import space as fa3_space
from codegen.families.fa3.host import fa3_tensor_maps, fa3_varlen_tensor_maps
from codegen.families.splitkv import space as splitkv_space
from codegen.families.splitkv.host import splitkv_workspace
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.splitkv_config import SplitKvConfig


def test_host_preparations_are_callables_of_the_entries() -> None:
    assert family("fa2").host_prep is None and family("fa2").varlen_host_prep is None
    assert family("fa3").host_prep is fa3_tensor_maps
    assert family("fa3").varlen_host_prep is fa3_varlen_tensor_maps
    assert family("splitkv").host_prep is splitkv_workspace


def test_varlen_capability_and_twins() -> None:
    assert [f.name for f in FAMILIES.values() if f.varlen] == ["fa2", "fa3"]
    fa2 = Fa2Config(128, "fp16", True, 128, 64, 4, 1, pad=8)
    assert family("fa2").varlen_twin(fa2) == replace(fa2, varlen=True)
    fa3 = Fa3Config(128, "fp16", True)
    assert family("fa3").varlen_twin(fa3) == replace(fa3, varlen=True)
    # The longest-first order is for dense grids: no packed twin; split-KV has no varlen.
    assert family("fa3").varlen_twin(replace(fa3, longest_first=True)) is None
    assert family("splitkv").varlen_twin(SplitKvConfig(128, "fp16", False)) is None


def test_space_listing_columns_are_the_old_per_family_ones() -> None:
    fa2 = Fa2Config(64, "bf16", False, 64, 64, 4, 2, pad=0, swizzle=True)
    assert family("fa2").est_registers(fa2) == fa2_space.estimate_registers(fa2)
    assert family("fa2").columns(fa2) == {"layout": "swizzle"}
    assert family("fa2").columns(replace(fa2, swizzle=False, pad=16)) == {"layout": "pad 16"}
    fa3 = Fa3Config(128, "fp16", False)
    assert family("fa3").est_registers(fa3) == (
        fa3_space.accumulator_regs(fa3) + fa3_space.REG_HEADROOM
    )
    skv = SplitKvConfig(128, "fp16", False)
    assert family("splitkv").est_registers(skv) == splitkv_space.accumulator_regs(skv)
    assert family("fa3").columns(fa3) == {} == family("splitkv").columns(skv)


def test_declared_choice_orders() -> None:
    assert family("fa2").choice_order("layout") == ("pad0", "pad8", "pad16", "swz")
    assert family("fa2").choice_order("br") is None
    assert family("fa3").added_search_defaults == {"fa3_order": "per_head"}
    assert family("fa2").added_search_defaults == {}
    assert family("splitkv").added_search_defaults == {"skv_span": "length"}
