"""Attention variants in what is tuned: workload entries, ``fa2tune tune``'s options, the
campaign's default space (configs with the switches set, families lacking one skipped) and
the problem handed to the worker."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import optuna
import pytest
import typer

from core.build_report import BuildReport
from core.problem import Problem
from core.records import MeasureResult
from core.variant import PLAIN, Variant
from db.store import Store
from tests.support.factories import make_report, ok_result
from tests.support.replay import GPU
from tuner.campaign import CampaignOptions, _defaults, run_campaign, with_variant
from tuner.campaign_plan import ShapeOptions, campaign_targets, replay_filter
from tuner.workload import WorkloadError, load_workload

optuna.logging.set_verbosity(optuna.logging.WARNING)
WINDOW = Variant(window_left=4096, window_right=0)


def _workload(tmp_path: Path, *entries: dict[str, object]) -> Path:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(list(entries)))
    return path


BASE = {"d": 128, "heads": 32, "kv_heads": 8, "n": 16384}


def _fa2_switches(monkeypatch: pytest.MonkeyPatch, switches: tuple[str, ...]) -> None:
    """fa2's kernels as if built with ``switches`` only: its registry entry and its space."""
    from codegen.families import FAMILIES

    monkeypatch.setattr("codegen.families.fa2.space.VARIANT_SWITCHES", switches)
    monkeypatch.setitem(
        FAMILIES, "fa2", dataclasses.replace(FAMILIES["fa2"], variant_switches=switches)
    )


def test_workload_entries_take_a_variant(tmp_path: Path) -> None:
    path = _workload(
        tmp_path,
        {**BASE, "window": 4096},  # a causal sliding window
        {**BASE, "window": [1024, 1024], "chunk": 8192},
        {**BASE, "softcap": 30, "sinks": True, "causal": True},
        {**BASE, "n": 2048, "window": [4096, 0]},  # past every key: (-1, 0), plain causal
    )
    targets = load_workload(path).targets
    assert [(t.causal, t.variant) for t in targets] == [
        (True, WINDOW),
        (False, Variant(1024, 1024, 8192)),
        (True, Variant(softcap=30.0, sinks=True)),
        (True, PLAIN),
    ]
    problem = targets[0].problem("H200")
    assert problem.variant == WINDOW and problem.study_name.endswith("_wl4096_wr0")
    assert targets[0].matches(problem) and not targets[1].matches(problem)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**BASE, "windw": 4096}, "unknown field 'windw'"),
        ({**BASE, "window": [-2, 0]}, "field 'window'"),
        ({**BASE, "window": "4096"}, "field 'window'"),
        ({**BASE, "window": 4096, "causal": False}, "causal window"),
        ({**BASE, "chunk": -1}, "field 'chunk'"),
        ({**BASE, "softcap": -1.0}, "field 'softcap'"),
        ({**BASE, "sinks": "yes"}, "field 'sinks'"),
    ],
)
def test_bad_variant_entries_are_one_line(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    with pytest.raises(WorkloadError, match=message) as info:
        load_workload(_workload(tmp_path, entry))
    assert "\n" not in str(info.value) and "entry 1" in str(info.value)


def test_tune_options_give_the_grid_a_variant() -> None:
    options = ShapeOptions(d="128", n="8192,16384", causal="yes", window="4096,0")
    targets = campaign_targets(options)
    assert [t.variant for t in targets] == [WINDOW, WINDOW]
    halves = ShapeOptions(d="128", n="8192", causal="yes", window_left=4096, sinks=True)
    (only,) = campaign_targets(halves)
    assert only.variant == Variant(4096, 0, sinks=True)
    # A window past every key of a problem is none there.
    (plain,) = campaign_targets(ShapeOptions(d="128", n="2048", causal="yes", window="4096,0"))
    assert plain.variant == PLAIN


@pytest.mark.parametrize(
    ("options", "option"),
    [
        (ShapeOptions(d="128", n="8192", window="4096"), "--window"),
        (ShapeOptions(d="128", n="8192", window="4096,0", window_left=5), "--window"),
        (ShapeOptions(d="128", n="8192", window_left=-3), "--window-left"),
        (ShapeOptions(d="128", n="8192", chunk=-1), "--chunk"),
        (ShapeOptions(d="128", n="8192", softcap=float("nan")), "--softcap"),
        (
            ShapeOptions(workloads=(Path("w.yaml"),), sinks=True),
            "--window/--chunk/--softcap/--sinks",
        ),
    ],
)
def test_bad_tune_variant_options(options: ShapeOptions, option: str) -> None:
    with pytest.raises(typer.BadParameter) as info:
        campaign_targets(options)
    assert option in str(info.value.param_hint)


def test_replay_filter_keeps_the_asked_variant() -> None:
    plain = Problem(gpu="g", d=128, n=8192, causal=True)
    windowed = Problem(gpu="g", d=128, n=8192, causal=True, variant=WINDOW)
    keep = replay_filter(ShapeOptions(window="4096,0"))
    assert [keep(p) for p in (plain, windowed)] == [False, True]
    keep_all = replay_filter(ShapeOptions())
    assert [keep_all(p) for p in (plain, windowed)] == [True, True]


def test_default_space_sets_the_switches_and_skips_families_without(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fa2_switches(monkeypatch, ())
    space_fn, seeds_fn, _ = _defaults("sm_90", GPU, None, None, None, only=("fa2",))
    plain = Problem(gpu=GPU.name, d=128, n=8192, causal=True)
    windowed = Problem(gpu=GPU.name, d=128, n=8192, causal=True, variant=WINDOW)
    assert space_fn(plain) and not any(c.has_variant for c in space_fn(plain))
    with caplog.at_level(logging.INFO, logger="tuner.campaign"):
        assert list(space_fn(windowed)) == []  # fa2's kernels without a local switch
    assert "skipping fa2" in caplog.text and "local" in caplog.text
    _fa2_switches(monkeypatch, ("local",))
    space_fn, seeds_fn, _ = _defaults("sm_90", GPU, None, None, None, only=("fa2",))
    configs = space_fn(windowed)
    assert configs and all(c.local and c.name.endswith("_loc") for c in configs)
    assert len(configs) == len(space_fn(plain))
    seeds = seeds_fn(windowed)
    assert seeds and all(c.variant_switches == {"local": True, "softcap": False,
                                                "sinks": False} for c in seeds)  # fmt: skip
    capped = Problem(gpu=GPU.name, d=128, n=8192, variant=Variant(softcap=5.0))
    assert list(space_fn(capped)) == []  # fa2 has local only
    assert with_variant(configs, plain) == configs  # plain needs are all off


def test_the_worker_gets_the_problem_with_its_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fa2_switches(monkeypatch, ("local",))
    problem = Problem(gpu=GPU.name, d=64, n=8192, causal=True, variant=WINDOW)
    seen: list[Problem] = []

    def build(configs: Sequence[object]) -> list[BuildReport]:
        # A cubin path (never opened: measure below is the worker) makes the build usable.
        return [dataclasses.replace(make_report(c), cubin=Path(f"/fake/{c.name}.cubin"))  # type: ignore[arg-type]
                for c in configs]  # fmt: skip

    def measure(report: BuildReport, p: Problem) -> MeasureResult:
        seen.append(p)
        assert report.config.variant_switches["local"]
        return ok_result(1.0 + len(seen) / 100, p)

    url = f"sqlite:///{tmp_path / 'results.db'}"
    with Store.from_url(url) as store:
        run_campaign(
            [problem], CampaignOptions(sampler="random", trials=3, seed=1, families=("fa2",)),
            store=store, storage_url=url, gpu=GPU, measure_fn=measure, build_fn=build,
        )  # fmt: skip
        assert seen and all(p == problem for p in seen)
        found = store.best_match(GPU.name, 64, "fp16", True, _shape(problem), variant=WINDOW)
        assert found is not None and found.result.variant == WINDOW
        assert found.result.config.local


def _shape(p: Problem):  # type: ignore[no-untyped-def]
    from core.shape import Shape

    return Shape(p.n, p.n_keys, p.batch, p.heads, p.n_kv_heads)


def test_a_variant_no_family_serves_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fa2_switches(monkeypatch, ())
    problem = Problem(gpu=GPU.name, d=64, n=8192, causal=True, variant=WINDOW)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    with Store.from_url(url) as store, pytest.raises(ValueError, match="attention variant"):
        run_campaign(
            [problem], CampaignOptions(sampler="random", trials=1, families=("fa2",)),
            store=store, storage_url=url, gpu=GPU, measure_fn=lambda r, p: ok_result(1.0, p),
            build_fn=lambda cs: [],
        )  # fmt: skip
