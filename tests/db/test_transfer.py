"""Dump and ingest: round trip, idempotence, validation, all-or-nothing, shipped results."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

import db.transfer
from core.build_report import BuildStatus
from core.problem import Problem as ProblemSpec
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.dump_format import DumpFile, TransferError, load_dump, parse_dump
from db.models import Build, Gpu, IngestedFile, Measurement, Problem
from db.shipped import load_shipped_results, shipped_files
from db.store import Store
from db.transfer import dump, export, ingest, ingest_file
from tests.support.factories import H200, failed_result, make_config, make_report, ok_result

L40S = GpuInfo(
    name="NVIDIA L40S",
    compute_capability="8.9",
    sm_count=142,
    driver_version="550.90.07",
    cuda_version="12.4",
    memory_bytes=48_305_799_168,
    smem_optin_bytes=101_376,
)


def _counts(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            model.__tablename__: int(
                conn.execute(select(func.count()).select_from(model)).scalar_one()
            )
            for model in (Gpu, Build, Problem, Measurement)
        }


def _populate(store: Store) -> int:
    """Two GPUs, several problems and builds, OK and failed measurements; returns count."""
    recorded = 0
    for gpu in (H200, L40S):
        gpu_id = store.upsert_gpu(gpu)
        for d, n, causal in ((128, 4096, False), (128, 1024, True), (64, 4096, False)):
            problem = ProblemSpec(gpu=gpu.name, d=d, n=n, causal=causal)
            pid = store.problem_id(problem, gpu_id)
            for i, (br, bc) in enumerate(((128, 64), (64, 64), (128, 32))):
                cfg = make_config(d=d, causal=causal, br=br, bc=bc)
                bid = store.record_build(make_report(cfg, arch=f"sm_{gpu.compute_capability[0]}0"))
                result: MeasureResult = ok_result(1.0 + i / 10 + d / 1000, problem)
                if i == 2:
                    result = dataclasses.replace(
                        failed_result(MeasureStatus.WRONG_RESULT, 0.5),
                        extra={"worst_index": [0, 3, 17], "note": "nan in row 17"},
                    )
                store.record_measurement(pid, bid, result, gpu, trial_number=i)
                recorded += 1
    # A failed build that was never measured still travels in a full dump.
    store.record_build(make_report(make_config(d=256, bc=128), status=BuildStatus.COMPILE_FAILED))
    return recorded


def _comparable(data: DumpFile) -> dict[str, Any]:
    return data.model_dump(mode="json", exclude={"created_at", "generator"})


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Store]:
    with Store.from_url(f"sqlite:///{tmp_path / 'source' / 'results.db'}") as store:
        _populate(store)
        yield store


def test_dump_ingest_round_trip(source: Store, target: Store, tmp_path: Path) -> None:
    path = tmp_path / "out" / "results.json"
    written = dump(source, path)
    assert path.is_file()
    assert not list(path.parent.glob(".*tmp"))  # atomic write leaves no temp file
    assert len(written.measurements) == 18
    assert len(written.builds) == 19  # 18 measured + 1 failed, unmeasured build

    summary = ingest_file(target, path)
    assert (summary.added, summary.skipped) == (18, 0)
    assert (summary.gpus_added, summary.builds_added, summary.problems_added) == (2, 19, 6)
    assert _counts(target) == _counts(source)
    # Everything survives, including extra JSON and non-finite error figures.
    assert _comparable(export(target)) == _comparable(export(source))
    for gpu in ("H200", "L40S"):
        a, b = source.best(gpu, 128, 4096), target.best(gpu, 128, 4096)
        assert a is not None and b is not None
        ids = {"measurement_id", "build_id", "problem_id"}
        assert {k: v for k, v in a.to_dict().items() if k not in ids} == {
            k: v for k, v in b.to_dict().items() if k not in ids
        }
    wrong = target.results(status="WRONG_RESULT", limit=1).items[0]
    assert wrong.max_abs_err is not None and math.isinf(wrong.max_abs_err)


def test_dump_file_is_plain_json_with_natural_keys(source: Store, tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    dump(source, path)
    raw = json.loads(path.read_text())  # standard JSON: no bare NaN/Infinity
    assert raw["format"] == "fa2tune-results" and raw["format_version"] == 2
    config = raw["builds"][0]["config"]
    assert config["family"] == "fa2" and set(config["params"]) == {
        "br", "bc", "warps", "stages", "pad", "swizzle"
    }  # fmt: skip
    m = raw["measurements"][0]
    assert set(m["problem"]) >= {"gpu", "compute_capability", "d", "n", "nk", "batch", "heads"}
    assert set(m["build"]) == {"config_name", "arch", "source_hash"}
    assert not any(key.endswith("_id") for key in m)
    wrong = next(x for x in raw["measurements"] if x["status"] == "WRONG_RESULT")
    assert wrong["max_abs_err"] == "Infinity"
    assert wrong["extra"] == {"worst_index": [0, 3, 17], "note": "nan in row 17"}


def test_ingest_is_idempotent(source: Store, target: Store) -> None:
    data = export(source)
    first = ingest(target, data)
    before = _counts(target)
    second = ingest(target, data.model_dump_json().encode())
    assert (first.added, second.added, second.skipped) == (18, 0, 18)
    assert (second.gpus_added, second.builds_added, second.problems_added) == (0, 0, 0)
    assert _counts(target) == before
    # Ingesting a database's own dump into it adds nothing either.
    assert ingest(source, data).added == 0


def test_ingest_adds_only_what_is_new(source: Store, target: Store) -> None:
    ingest(target, export(source))
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    pid = source.problem_id(problem, source.upsert_gpu(H200))
    bid = source.record_build(make_report(make_config(br=128, bc=128)))
    source.record_measurement(pid, bid, ok_result(0.5, problem), H200)

    summary = ingest(target, export(source))
    assert (summary.added, summary.skipped, summary.builds_added) == (1, 18, 1)
    best = target.best("h200", 128, 4096)
    assert best is not None and best.config == make_config(br=128, bc=128)


def test_dump_filtered_by_gpu(source: Store, target: Store) -> None:
    data = export(source, gpu="nvidia l40s")
    assert [g.name for g in data.gpus] == ["NVIDIA L40S"]
    assert len(data.measurements) == 9
    assert {m.problem.gpu for m in data.measurements} == {"NVIDIA L40S"}
    assert {b.arch for b in data.builds} == {"sm_80"}  # only builds its measurements use
    ingest(target, data)
    assert target.best("L40S", 128, 4096) is not None
    assert target.best("H200", 128, 4096) is None


def test_parse_dump_accepts_bytes_text_and_dicts(source: Store) -> None:
    data = export(source)
    text = data.model_dump_json()
    for given in (text, text.encode(), json.loads(text)):
        assert parse_dump(given) == data


def _valid() -> dict[str, Any]:
    problem = {
        "gpu": "NVIDIA H200",
        "compute_capability": "9.0",
        "d": 128,
        "n": 4096,
        "nk": 4096,
        "batch": 2,
        "heads": 16,
        "kv_heads": 16,
        "dtype": "fp16",
        "causal": False,
    }
    cfg = make_config()
    return {
        "format": "fa2tune-results",
        "format_version": 1,
        "created_at": "2024-11-29T12:00:00+00:00",
        "gpus": [
            {
                "name": "NVIDIA H200",
                "compute_capability": "9.0",
                "sm_count": 132,
                "driver_version": "560.35.03",
                "cuda_version": "12.6",
            }
        ],
        "builds": [
            {
                "config_name": cfg.name,
                "config": cfg.to_dict(),
                "arch": "sm_90",
                "status": "OK",
                "registers": 168,
                "source_hash": "abc",
                "nvcc_version": "12.6",
            }
        ],
        "problems": [problem],
        "measurements": [
            {
                "problem": problem,
                "build": {"config_name": cfg.name, "arch": "sm_90", "source_hash": "abc"},
                "status": "OK",
                "median_ms": 1.25,
                "driver_version": "560.35.03",
                "cuda_version": "12.6",
                "created_at": "2024-11-29T12:00:00Z",
            }
        ],
    }


def _break(path: str, value: Any) -> dict[str, Any]:
    data = _valid()
    node: Any = data
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()

INVALID = {
    "wrong format version": (_break("format_version", 99), "format_version"),
    "not a results file": ({"hello": "world"}, "hello"),
    "negative median": (_break("measurements.0.median_ms", -1.0), "measurements.0.median_ms"),
    "ok without median": (_break("measurements.0.median_ms", None), "needs median_ms"),
    "unknown status": (_break("measurements.0.status", "FAST"), "measurements.0.status"),
    "bad dtype": (_break("problems.0.dtype", "fp8"), "problems.0.dtype"),
    "missing field": (_break("measurements.0.created_at", _DELETE), "created_at"),
    "typo field": (_break("gpus.0.sm_cnt", 132), "sm_cnt"),
    "name does not match config": (
        _break("builds.0.config_name", "fa2_d64_fp16_full_br128_bc64_w4_s1_pad8"),
        "does not match",
    ),
    "unknown family": (_break("builds.0.config.family", "fa9"), "unknown kernel family 'fa9'"),
    "unknown parameter": (_break("builds.0.config.tile", 3), "no parameter(s) tile"),
    "missing parameter": (_break("builds.0.config.warps", _DELETE), "missing: warps"),
    "unparsable build ref": (
        _break("measurements.0.build.config_name", "kernel7"),
        "not a kernel config name",
    ),
    "unknown build": (_break("measurements.0.build.source_hash", "zzz"), "not in builds"),
    "unknown gpu": (_break("problems.0.compute_capability", "8.0"), "not in gpus"),
    "gqa heads": (_break("problems.0.kv_heads", 3), "multiple of kv_heads"),
}


def test_valid_fixture_is_valid(target: Store) -> None:
    assert ingest(target, _valid()).added == 1


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_files_are_rejected_with_nothing_written(target: Store, case: str) -> None:
    data, expected = INVALID[case]
    with pytest.raises(TransferError) as info:
        ingest(target, data)
    assert expected in str(info.value)
    assert str(info.value).startswith("invalid results file")
    assert _counts(target) == {"gpus": 0, "builds": 0, "problems": 0, "measurements": 0}


def test_invalid_json_and_unreadable_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "fa2tune-results", "gpus": [')
    with pytest.raises(TransferError, match=r"Invalid JSON|EOF"):
        load_dump(bad)
    with pytest.raises(TransferError, match="cannot read"):
        load_dump(tmp_path / "missing.json")


def test_ingest_is_all_or_nothing(
    source: Store, target: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after GPUs, builds and problems were flushed rolls all of them back."""
    data = export(source)

    class Exploding:
        """Measurement for queries, but creating a row fails (the last step of ingest)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(Measurement, name)

        def __call__(self, **kwargs: object) -> Any:
            raise RuntimeError("disk on fire")

    monkeypatch.setattr(db.transfer, "Measurement", Exploding())
    with pytest.raises(RuntimeError, match="disk on fire"):
        ingest(target, data)
    assert _counts(target) == {"gpus": 0, "builds": 0, "problems": 0, "measurements": 0}


def test_naive_timestamps_are_utc(target: Store) -> None:
    data = _valid()
    data["measurements"][0]["created_at"] = "2024-11-29T12:00:00"
    ingest(target, data)
    aware = _valid()  # same instant written with a zone: a duplicate
    assert ingest(target, aware).added == 0
    shifted = _valid()
    shifted["measurements"][0]["created_at"] = "2024-11-29T13:00:00+01:00"  # same instant
    assert ingest(target, shifted).added == 0


# --------------------------------------------------------------------------------- shipped


def test_load_shipped_results_once(source: Store, target: Store, tmp_path: Path) -> None:
    shipped = tmp_path / "h200_results.json"
    dump(source, shipped, gpu="H200")

    assert load_shipped_results(target, files=[shipped]) == 9
    assert load_shipped_results(target, files=[shipped]) == 0
    with target.engine.connect() as conn:
        marker = conn.execute(select(IngestedFile)).one()
    assert (marker.name, marker.measurements_added) == ("h200_results.json", 9)
    best = target.best("H200", 128, 4096)
    assert best is not None and best.gpu == "NVIDIA H200"

    # A new release's file (changed content) is ingested again; only new rows land.
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    pid = source.problem_id(problem, source.upsert_gpu(H200))
    bid = source.record_build(make_report(make_config(br=64, bc=32)))
    source.record_measurement(pid, bid, ok_result(0.25, problem), H200)
    dump(source, shipped, gpu="H200")
    assert load_shipped_results(target, files=[shipped]) == 1
    assert _counts(target)["measurements"] == 10


def test_shipped_second_load_does_not_parse(
    source: Store, target: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "x.json"
    dump(source, shipped)
    load_shipped_results(target, files=[shipped])

    def boom(*_: object) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr("db.shipped.parse_dump", boom)
    assert load_shipped_results(target, files=[shipped]) == 0


def test_packaged_results_files_are_valid() -> None:
    files = shipped_files()
    if not files:
        pytest.skip("no results files shipped in db/data yet")
    for file in files:
        data = parse_dump(file.read_bytes())
        assert data.measurements, file.name
