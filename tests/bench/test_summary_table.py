"""bench/summary_table.py on small synthetic runs (CPU).

The inputs are written the way the benches write them: rows with the keys their ``run``
functions fill, each checked by the bench's own writer (compare_sdpa.write_table,
decode_bench.table, varlen_bench.markdown), so a renamed key fails here before it reaches a
device run. Times are chosen so that the ranges, medians and counts below are exact.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from core.problem import Problem
from core.records import GpuInfo

ROOT = Path(__file__).resolve().parents[2]
GPU = GpuInfo("NVIDIA H200", "9.0", 132, "580.159.04", "13.0")


def _load(name: str) -> ModuleType:
    """A bench/ script as a module (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


st = _load("summary_table")
compare_sdpa = _load("compare_sdpa")
decode_bench = _load("decode_bench")
varlen_bench = _load("varlen_bench")


def compare_row(
    p: Problem, ms: float, flash: float | None, cudnn: float | None, **over: Any
) -> dict[str, Any]:
    """A compare_sdpa.run row of an OK measurement; ``flash``, ``cudnn``: the backends' times
    as multiples of ``ms`` (None: the backend did not run)."""
    row: dict[str, Any] = {
        "d": p.d, "n": p.n, "dtype": p.dtype, "causal": p.causal,
        "config": f"fa3_d{p.d}_{p.dtype}", "family": "fa3", "tuned": True, "status": "OK",
        "ms": ms, "tflops": p.tflops(ms), "max_abs_err": 0.004,
    }  # fmt: skip
    for name, ratio in (("flash", flash), ("cudnn", cudnn)):
        if ratio is not None:
            row[f"{name}_tflops"] = p.tflops(ms * ratio)
            row[f"vs_{name}"] = ratio
    row.update(over)
    return row


def compare_doc(rows: list[dict[str, Any]], batch: int, heads: int, **meta: Any) -> dict[str, Any]:
    """A compare_sdpa.json document, as summary_run.sh bundles it (``meta`` + kv_heads)."""
    doc = {"meta": {"gpu": GPU.to_dict(), "date": "2026-12-03", "batch": batch,
                    "heads": heads, **meta}, "rows": rows}  # fmt: skip
    compare_sdpa.write_table(rows, doc["meta"], Path("/dev/null"))  # the bench reads its rows
    return doc


def prefill(d: int, n: int, causal: bool = False) -> Problem:
    return Problem(gpu=GPU.name, d=d, n=n, batch=2, heads=16, dtype="fp16", causal=causal)


def prefill_docs() -> list[dict[str, Any]]:
    """D=64 non-causal: 3 cells, flash 1.5/1.2/1.1, cuDNN 0.9/1.05/1.3; D=64 causal: one cell
    beside an untuned row (FA2's default) and a wrong one; D=256 in a second document."""
    first = [
        compare_row(prefill(64, 1024), 0.1, 1.5, 0.9),
        compare_row(prefill(64, 4096), 1.0, 1.2, 1.05),
        compare_row(prefill(64, 16384), 10.0, 1.1, 1.3),
        compare_row(prefill(64, 4096, True), 0.5, 2.0, 0.8),
        compare_row(prefill(64, 1024, True), 0.2, 1.0, 1.0, tuned=False),
        {**compare_row(prefill(64, 16384, True), 9.0, None, None), "status": "WRONG_RESULT"},
    ]
    second = [compare_row(prefill(256, 4096), 4.0, 1.25, 1.0)]
    return [compare_doc(first, 2, 16, kv_heads=16), compare_doc(second, 2, 16, kv_heads=16)]


def gqa_docs() -> list[dict[str, Any]]:
    """Causal 32:8 at B 1/4/16 x N 512/8192; cuDNN missing at B=16 N=8192."""
    docs = []
    for batch, ratios in ((1, (1.6, 1.0, 1.7, 0.95)), (4, (1.5, 1.1, 1.8, 0.9)),
                          (16, (1.4, 1.2, 1.9, None))):  # fmt: skip
        rows = [
            compare_row(Problem(gpu=GPU.name, d=128, n=n, batch=batch, heads=32, kv_heads=8,
                                dtype="bf16", causal=True), 0.1 * batch * n / 512, f, c)
            for n, f, c in ((512, *ratios[:2]), (8192, *ratios[2:]))
        ]  # fmt: skip
        docs.append(compare_doc(rows, batch, 32, kv_heads=8))
    return docs


def decode_row(batch: int, nk: int, ms: float, flash: float | None, cudnn: float | None,
               **over: Any) -> dict[str, Any]:  # fmt: skip
    """A row of summary_run.sh's decode driver (decode_bench.run's keys, plus ``shipped``)."""
    p = Problem(gpu=GPU.name, d=128, n=1, nk=nk, batch=batch, heads=32, kv_heads=8, dtype="bf16")
    name = "splitkv_d128_bf16_full_r16_n32_w4_s2_k4"
    gbps = decode_bench.kv_bytes(p) / (ms * 1e-3) / 1e9
    row: dict[str, Any] = {
        "dtype": "bf16", "nq": 1, "nk": nk, "batch": batch, "heads": 32, "kv_heads": 8,
        "d": 128, "failures": [], "flush_by": "write", "shipped": name, "shipped_ms": ms,
        "best": name, "ms": ms, "top": [(name, ms)], "gbps": gbps,
        "hbm_fraction": gbps * 1e9 / decode_bench.H200_PEAK_BYTES_PER_S, "splitkv_ms": ms,
    }  # fmt: skip
    for key, ratio in (("flash", flash), ("cudnn", cudnn)):
        if ratio is not None:
            row.update({f"{key}_ms": ms * ratio, f"vs_{key}": ratio})
    row.update(over)
    return row


def decode_doc() -> dict[str, Any]:
    """B 1/64 x Nk 1k/128k; SDPA ran out of memory at B=64 Nk=128k (no backend times)."""
    rows = [
        decode_row(1, 1024, 0.012, 1.25, 0.99),
        decode_row(64, 1024, 0.08, 1.4, 0.95),
        decode_row(1, 131072, 0.14, 1.15, 1.01),
        decode_row(64, 131072, 7.5, None, None),
    ]
    decode_bench.table(rows)
    return {"measured_at": "2026-12-03T10:00:00+00:00", "rows": rows}


LENS = [3499, 100, 3861, 265]  # 7725 tokens


def varlen_row(causal: bool, shipped_ms: float, best_ms: float, **over: Any) -> dict[str, Any]:
    """A varlen_bench.run_case row where the shipped pick (``*_pick_vl``) is slower than the
    grid's fastest (``*_grid_vl``): padded SDPA flash 8 ms, cuDNN 4 ms."""
    tflop = 1.5 if causal else 3.0
    mask = "causal" if causal else "full"
    pick, grid = f"fa3_d128_bf16_{mask}_pick_vl", f"fa3_d128_bf16_{mask}_grid_vl"
    row: dict[str, Any] = {
        "lengths": LENS, "heads": 32, "kv_heads": 8, "d": 128, "dtype": "bf16",
        "causal": causal, "tflop": tflop,
        "configs": {pick: {"status": "OK", "ms": shipped_ms, "max_abs_err": 0.002},
                    grid: {"status": "OK", "ms": best_ms, "max_abs_err": 0.002}},
        "best": grid, "ms": best_ms, "tflops": tflop / best_ms * 1e3,
        "family_best": {"fa3": {"config": grid, "ms": best_ms, "tflops": tflop / best_ms * 1e3}},
        "padded": {"flash": 8.0, "cudnn": 4.0}, "flash_varlen_ms": 5.0,
        "dense": {"config": grid[:-3], "n": 1931, "ok": True, "ms": best_ms, "tflops": 500.0},
        "shipped": pick, "shipped_lengths": LENS,
    }  # fmt: skip
    row.update(over)
    return row


def varlen_doc(*rows: dict[str, Any]) -> dict[str, Any]:
    varlen_bench.markdown(list(rows), "header")
    return {"when": "2026-12-03T10:05:00+00:00", "gpu": GPU.name, "rows": list(rows)}


RUN_LOG = """\
env.date: 2026-12-03 10:00 UTC
env.gpu: NVIDIA H200
env.driver: 580.159.04
env.cuda: 13.0
env.nvcc: 13.0.88
env.torch: 2.11.0+cu130
env.cudnn: 9.10.2
env.commit: abc1234
env.command: PARTS="prefill gqa decode varlen" bash bench/h200/summary_run.sh
part prefill_a: exit 0 in 120 s (limit 240 s)
== prefill_a.log
2026-12-03 10:00:01 INFO env.gpu: not an env line, it does not start the line
"""


def write_run(folder: Path, *, run_log: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prefill.json").write_text(json.dumps(prefill_docs()))
    (folder / "gqa.json").write_text(json.dumps(gqa_docs()))
    (folder / "decode.json").write_text(json.dumps(decode_doc()))
    varlen = varlen_doc(varlen_row(True, 2.0, 1.6), varlen_row(False, 3.0, 3.0))
    (folder / "varlen.json").write_text(json.dumps(varlen))
    if run_log:
        (folder / "run.log").write_text(RUN_LOG)
    return folder


def test_spread_median_of_an_even_count_and_nothing() -> None:
    assert st.Spread.of([1.3, None, 0.9, 1.0, 1.2]) == st.Spread(0.9, 1.3, 1.1, 4)
    assert st.Spread.of([None]) is None


def test_prefill_rows_per_mask_and_d_without_untuned_or_failed_cells() -> None:
    rows = st.prefill_rows(prefill_docs())
    assert [r.label for r in rows] == [
        "prefill non-causal D=64", "prefill non-causal D=256", "prefill causal D=64",
    ]  # fmt: skip
    full64, full256, causal64 = rows
    assert [c.x for c in full64.cells] == [1024, 4096, 16384]
    assert (full64.skipped, full256.skipped, causal64.skipped) == (0, 0, 2)
    assert full64.shapes() == "B=2 H=16, N 1k-16k, fp16"
    rates = [prefill(64, n).tflops(ms) for n, ms in ((1024, 0.1), (4096, 1.0), (16384, 10.0))]
    assert st.table_line(full64) == (
        f"| prefill non-causal D=64 | B=2 H=16, N 1k-16k, fp16 | 3 "
        f"| {min(rates):.0f}-{max(rates):.0f} TFLOP/s | 1.10-1.50 (1.20) | 0.90-1.30 (1.05) | 1 |"
    )
    assert st.table_line(causal64).startswith("| prefill causal D=64 | B=2 H=16, N 4k, fp16 | 1 |")
    assert st.table_line(causal64).endswith("| 2.00-2.00 (2.00) | 0.80-0.80 (0.80) | 1 |")
    assert st.table_line(full256).endswith("| 1.25-1.25 (1.25) | 1.00-1.00 (1.00) | 0 |")


def test_gqa_row_counts_the_cells_where_cudnn_ran() -> None:
    (row,) = st.gqa_rows(gqa_docs())
    assert row.label == "GQA prefill causal D=128"
    assert row.shapes() == "B=1/4/16 H=32:8, N 512-8k, bf16"
    flash = st.Spread.of(c.vs(c.flash_ms) for c in row.cells)
    assert flash is not None and flash.count == 6
    assert (flash.lo, flash.median, flash.hi) == pytest.approx((1.4, 1.65, 1.9))
    # cuDNN 1.0/0.95, 1.1/0.9, 1.2/none: two below 1.0x (1.0 is not below), five in all
    assert st.table_line(row).endswith("| 1.40-1.90 (1.65) | 0.90-1.20 (1.00) [5] | 2 |"), (
        st.table_line(row)
    )


def test_decode_row_in_tb_per_s_with_sdpa_missing_where_it_ran_out_of_memory() -> None:
    (row,) = st.decode_rows(decode_doc())
    assert row.label == "decode Nq=1 D=128"
    assert row.shapes() == "B=1/64 H=32:8, Nk 1k-128k, bf16"
    rates = {(c.batch, c.x): c.rate for c in row.cells}
    # K and V of B=64 x 8 KV heads x 128k keys x D=128 in bf16 = 34.4 GB, in 7.5 ms
    assert rates[(64, 131072)] == pytest.approx(2 * 64 * 8 * 131072 * 128 * 2 / 7.5e-3 / 1e12)
    line = st.table_line(row)
    lo, hi = min(rates.values()), max(rates.values())
    ratios = "| 1.15-1.40 (1.25) [3] | 0.95-1.01 (0.99) [3] | 2 |"
    assert line.endswith(f"| 4 | {lo:.2f}-{hi:.2f} TB/s {ratios}"), line
    cell = next(c for c in row.cells if c.batch == 1 and c.x == 1024)
    assert cell.rate_of(cell.flash_ms) == pytest.approx(cell.rate / 1.25)


def test_decode_rows_of_decode_bench_itself_say_best_of_grid() -> None:
    doc = decode_doc()
    for r in doc["rows"]:
        del r["shipped"], r["shipped_ms"]
    (row,) = st.decode_rows(doc)
    assert row.shapes().endswith("(best of decode_bench's grid)")


def test_varlen_counts_the_shipped_pick_not_the_grid_fastest() -> None:
    (row,) = st.varlen_rows(varlen_doc(varlen_row(True, 2.0, 1.6), varlen_row(False, 3.0, 3.0)))
    assert row.label == "varlen 4 seqs (100-3861) D=128"
    assert row.shapes() == "B=4 H=32:8, tokens 7725, bf16, causal+full"
    causal = next(c for c in row.cells if c.causal)
    assert causal.ms == 2.0  # the shipped pick's, though the grid had a 1.6 ms config
    assert causal.rate == pytest.approx(1.5e3 / 2.0)
    assert st.table_line(row).endswith(
        "| 2 | 750-1000 TFLOP/s | 2.67-4.00 (3.33) | 1.33-2.00 (1.67) | 0 |"
    ), st.table_line(row)


def test_varlen_shipped_pick_that_did_not_verify_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = varlen_row(True, 2.0, 1.6)
    wrong["configs"][wrong["shipped"]] = {"status": "WRONG", "error": "max err 0.5"}
    plain = varlen_row(False, 3.0, 2.5)
    del plain["shipped"]  # varlen_bench's own output: its fastest candidate counts
    with caplog.at_level(logging.WARNING, logger="summary_table"):
        (row,) = st.varlen_rows(varlen_doc(wrong, plain))
    assert row.skipped == 1
    assert [c.ms for c in row.cells] == [2.5]
    assert row.shapes().endswith("(best of varlen_bench's candidates)")
    assert "has no time (WRONG)" in caplog.text


def test_header_from_run_log(tmp_path: Path) -> None:
    summary = st.load(write_run(tmp_path))
    assert st.header(summary.env) == (
        "Measured 2026-12-03 10:00 UTC on NVIDIA H200: driver 580.159.04, CUDA 13.0 (nvcc "
        "13.0.88), torch 2.11.0+cu130, cuDNN 9.10.2; commit abc1234; "
        '`PARTS="prefill gqa decode varlen" bash bench/h200/summary_run.sh`.'
    )


def test_run_log_empty_values_leave_the_json_figures(tmp_path: Path) -> None:
    folder = write_run(tmp_path)
    (folder / "run.log").write_text("env.gpu: \nenv.driver:\nenv.torch: 2.11.0+cu130\n")
    env = st.load(folder).env
    assert (env["gpu"], env["driver"]) == ("NVIDIA H200", "580.159.04")  # from prefill.json
    assert env["torch"] == "2.11.0+cu130"


def test_header_falls_back_on_what_the_json_records(tmp_path: Path) -> None:
    summary = st.load(write_run(tmp_path, run_log=False))
    assert st.header(summary.env) == (
        "Measured 2026-12-03 on NVIDIA H200: driver 580.159.04, CUDA 13.0, torch unknown, "
        "cuDNN unknown; commit unknown; `unknown`."
    )


def test_summary_fits_one_screen_and_skips_plots_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    with caplog.at_level(logging.WARNING, logger="summary_table"):
        st.summarize(write_run(tmp_path / "run"), tmp_path / "out")
    text = (tmp_path / "out" / "summary.md").read_text()
    lines = text.splitlines()
    table = [line for line in lines if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == [
        "| prefill non-causal D=64", "| prefill non-causal D=256", "| prefill causal D=64",
        "| GQA prefill causal D=128", "| decode Nq=1 D=128", "| varlen 4 seqs (100-3861) D=128",
    ]  # fmt: skip
    assert len(lines) <= 20
    assert lines[0].startswith("Measured 2026-12-03 10:00 UTC on NVIDIA H200")
    assert lines[-1] == ("2 bench rows without a fa2tune figure (failed, untuned or the shipped "
                         "pick did not verify) are left out.")  # fmt: skip
    assert "matplotlib is not installed" in caplog.text
    assert not any((tmp_path / "out" / name).exists() for name in st.PLOTS)


def test_missing_parts_are_left_out(tmp_path: Path) -> None:
    folder = write_run(tmp_path)
    (folder / "prefill.json").unlink()
    (folder / "varlen.json").unlink()
    text = st.markdown(st.load(folder))
    assert "| prefill " not in text and "| varlen " not in text
    assert "| decode Nq=1 D=128 |" in text


def test_a_run_with_nothing_measured_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no measured cell"):
        st.summarize(tmp_path, tmp_path)


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    st.summarize(write_run(tmp_path), tmp_path)
    for name in st.PLOTS:
        assert (tmp_path / name).stat().st_size > 10_000
