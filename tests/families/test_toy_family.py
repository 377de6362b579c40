"""A fourth family registered at run time, in this test only, goes through every stage.

The toy family declares its config once (two parameters), gives its space, render, grid and
header part to :func:`codegen.families.register`, and is then taken through the space, the
render, a build with a stand-in nvcc, a replayed search (optuna draws its declared
parameters), the store, ``/v1/best`` and the exported header, with no line of the product
changed for it (issue 22: a new family touches its own folder and one registry line).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from codegen import build as build_mod
from codegen.families import (
    FAMILIES,
    Family,
    HeaderPart,
    declared,
    family,
    family_of,
    register,
    unregister,
)
from core.config import Dtype
from core.config_common import FamilyConfigBase, family_config, param
from core.family import AnyConfig, config_from_name, config_from_params
from core.problem import Problem
from core.records import GpuInfo
from core.shape import Shape
from db.store import Store
from tuner import search
from tuner.campaign import CampaignOptions
from tuner.replay import run_replay_campaign
from tuner.replay_table import ReplayEntry, ReplayTable

GPU = GpuInfo(
    name="Toy GPU", compute_capability="9.0", sm_count=132, driver_version="560.0",
    cuda_version="12.6", memory_bytes=141 * 2**30, smem_optin_bytes=227 * 1024,
)  # fmt: skip


@family_config("toy", example="toy_d64_fp16_full_t64")
@dataclass(frozen=True, order=True)
class ToyConfig(FamilyConfigBase):
    d: int
    dtype: Dtype
    causal: bool
    tile: int = param("t{}", default=64, search="toy_tile")
    fast: bool = param("f", default=False, search="toy_fast", search_as=("fast", "slow"))

    @property
    def threads(self) -> int:
        return 2 * self.tile

    @property
    def smem_bytes(self) -> int:
        return self.tile * self.d * 2

    def describe(self) -> str:
        return f"tile {self.tile}{', fast' if self.fast else ''}"


def _toy(config: AnyConfig) -> ToyConfig:
    assert isinstance(config, ToyConfig)
    return config


def _space(d: int, dtype: Dtype, causal: bool, smem: int, arch: str) -> list[AnyConfig]:
    configs = [ToyConfig(d, dtype, causal, t, f) for t in (32, 64, 128) for f in (False, True)]
    return [c for c in configs if c.smem_bytes <= smem]  # type: ignore[misc]


TOY = Family(
    name="toy",
    summary="a toy family of the tests",
    templates=("toy_fwd.cuh",),
    archs=("sm_90",),
    space=_space,
    check=lambda c, smem: (c.smem_bytes <= smem, ""),
    seeds=lambda d, dtype, causal: [ToyConfig(d, dtype, causal)],  # type: ignore[list-item]
    default=lambda d, dtype, causal: ToyConfig(d, dtype, causal),  # type: ignore[return-value]
    render=lambda c: declared.instantiation(_toy(c), "toy_fwd.cuh", "TOY_DEFINE_KERNEL"),
    grid=lambda c, s: (-(-s.nq // _toy(c).tile), s.heads, s.batch),
    header=HeaderPart(
        template="toy_fwd.cuh",
        traits=lambda c: declared.traits(_toy(c), "toy::Traits"),
        kernel="toy::fwd_kernel",
        launcher="toy::launch",
    ),
)

FAKE_NVCC = r"""#!{python}
import re, sys
from pathlib import Path
args = sys.argv[1:]
if args == ["--version"]:
    print("nvcc: fake\nCuda compilation tools, release 99.0, V99.0.1")
    sys.exit(0)
out, src = args[args.index("-o") + 1], Path(args[-1]).read_text()
name = re.search(r"TOY_DEFINE_KERNEL\((\w+),", src).group(1)
sys.stderr.write(
    f"ptxas info    : Compiling entry function '{{name}}' for 'sm_90'\n"
    f"ptxas info    : Function properties for {{name}}\n"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 64 registers, used 1 barriers\n"
)
Path(out).write_bytes(b"fake cubin")
"""


@pytest.fixture
def toy() -> Iterator[Family]:
    assert "toy" not in FAMILIES
    register(TOY, ToyConfig)
    try:
        yield TOY
    finally:
        unregister("toy")
    assert "toy" not in FAMILIES


def test_registering_twice_or_under_another_name_is_refused(toy: Family) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(TOY, ToyConfig)
    with pytest.raises(ValueError, match="family 'toy'"):
        register(replace(TOY, name="other"), ToyConfig)


def test_space_names_and_render_derive_from_the_declaration(toy: Family) -> None:
    configs = family("toy").space(64, "fp16", True, 227 * 1024, "sm_90")
    assert len(configs) == 6
    fast = ToyConfig(64, "fp16", True, 128, True)
    assert fast.name == "toy_d64_fp16_causal_t128_f"
    assert config_from_name(fast.name) == fast and family_of(fast) is toy
    assert config_from_params("toy", 64, "fp16", True, fast.params()) == fast
    assert fast.search_params() == {"toy_tile": 128, "toy_fast": "fast"}
    assert toy.render(fast) == (
        '#include "toy_fwd.cuh"\nTOY_DEFINE_KERNEL(toy_d64_fp16_causal_t128_f, 64, __half, '
        "true, 128, true)\n"
    )
    assert toy.header.traits(fast) == "toy::Traits<64, __half, true, 128, true>"
    assert toy.grid(fast, Shape(300, 300, 2, 8, 8)) == (3, 8, 2)
    with pytest.raises(ValueError, match=r"expected e\.g\. toy_d64_fp16_full_t64"):
        ToyConfig.from_name("toy_d64_fp16_full_x64")


def test_a_build_with_a_stand_in_nvcc(toy: Family, tmp_path: Path) -> None:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(0o755)
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "toy_fwd.cuh").write_text("// the toy template\n")
    build_mod.nvcc_version.cache_clear()
    configs = toy.space(64, "fp16", False, 227 * 1024, "sm_90")
    batch = build_mod.build_batch(
        configs, "sm_90", tmp_path / "cache", 2, nvcc=str(nvcc), template_dir=templates
    )
    build_mod.nvcc_version.cache_clear()
    assert [r.config for r in batch.reports] == configs
    assert all(r.status == "OK" and r.registers == 64 for r in batch.reports)
    rendered = sorted((tmp_path / "cache").rglob("*.cu"))
    assert len(rendered) == len(configs)
    assert "TOY_DEFINE_KERNEL(" in rendered[0].read_text()


def _problem() -> Problem:
    return Problem(gpu=GPU.name, d=64, n=1024, batch=1, heads=8, kv_heads=8, dtype="fp16",
                   causal=False)  # fmt: skip


def test_replayed_search_store_best_and_header(
    toy: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    import service.header as header_mod
    from codegen.export import TEMPLATE_DIR, render_header
    from service.header import export_header
    from service.main import create_app

    problem = _problem()
    configs = toy.space(64, "fp16", False, 227 * 1024, "sm_90")
    best = ToyConfig(64, "fp16", False, 128, True)
    times = {c.name: 0.5 + 0.1 * (c.tile != 128) + 0.05 * (not c.fast) for c in configs}
    assert min(times, key=times.__getitem__) == best.name
    table = ReplayTable(
        studies={problem.study_name: {n: ReplayEntry("OK", t) for n, t in times.items()}},
        problems={problem.study_name: problem}, gpu=GPU, arch="sm_90",
    )  # fmt: skip
    space = search.SearchSpace.from_configs(configs)
    assert space.param_names == ("toy_tile", "toy_fast")
    assert space.choices["toy_fast"] == ("fast", "slow")
    with Store.from_url(f"sqlite:///{tmp_path / 'results.db'}") as store:
        summary = run_replay_campaign(
            table, CampaignOptions(sampler="grid"), store=store,
            storage_url=f"sqlite:///{tmp_path / 'studies.db'}",
            space_fn=lambda p: configs, seeds_fn=lambda p: [best],
        )  # fmt: skip
        assert summary.problems[0].best_config == best.name
        assert summary.problems[0].space_size == len(configs) == 6
        with TestClient(create_app(store)) as client:
            params: dict[str, Any] = {"gpu": GPU.name, "d": 64, "dtype": "fp16",
                                      "causal": False, "batch": 1, "heads": 8, "kv_heads": 8,
                                      "nq": 1024, "nk": 1024}  # fmt: skip
            body = client.get("/v1/best", params=params).json()
        assert body["config"]["name"] == best.name
        assert body["config"]["family"] == "toy"
        assert body["config"]["params"] == {"tile": 128, "fast": True}
        # The exported header's text, from templates beside which the toy's lies.
        templates = tmp_path / "templates"
        shutil.copytree(TEMPLATE_DIR, templates)
        (templates / "toy_fwd.cuh").write_text("#pragma once\nnamespace toy {} // toy template\n")

        def with_toy_templates(*args: Any, **kwargs: Any) -> str:
            return render_header(*args, **kwargs, template_dir=templates)

        monkeypatch.setattr(header_mod, "render_header", with_toy_templates)
        text = export_header(store, GPU.name, [64], dtypes=["fp16"],
                             generated_at=datetime(2026, 12, 1, tzinfo=UTC))  # fmt: skip
    assert "namespace toy {} // toy template" in text
    assert "toy::Traits<64, __half, false, 128, true>" in text
    assert "template cudaError_t toy::launch<" in text
