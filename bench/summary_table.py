"""The README's one-screen results table and two plots, from one bench/h200/summary_run.sh run.

Reads whichever of these the run left in one folder:

* ``prefill.json``, ``gqa.json``: a list of bench/compare_sdpa.py documents (``{"meta",
  "rows"}``, one per invocation, each ``meta`` also given ``kv_heads``); one bare document
  is read too;
* ``decode.json``: bench/decode_bench.py's document (``{"measured_at", "rows"}``), written by
  the run's shipped-pick driver (each row names its pick: ``shipped``) or by decode_bench
  itself (the best of its grid, flagged so in the table);
* ``varlen.json``: bench/varlen_bench.py's document (``{"when", "gpu", "rows"}``); where a
  row names the shipped pick (``shipped``) its time counts, else the bench's fastest;
* ``run.log``: ``env.<key>: <value>`` lines (date, gpu, driver, cuda, nvcc, torch, cudnn,
  commit, command) for the header.

Writes ``summary.md`` and, when matplotlib is installed, ``families_vs_sdpa.png`` and
``decode_bandwidth.png``::

    python bench/summary_table.py --dir out
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("summary_table")

#: The H200's HBM3e bandwidth as NVIDIA states it (bench/decode_bench.py's figure).
H200_PEAK_TBPS = 4.8
ENV_LINE = re.compile(r"^env\.(\w+): (.*)$")
PLOTS = ("families_vs_sdpa.png", "decode_bandwidth.png")


@dataclass(frozen=True)
class Cell:
    """One shape measured: fa2tune's time and rate (TFLOP/s; TB/s of K/V for decode) and each
    SDPA backend's time on the same inputs (None where it did not run)."""

    x: int  # the swept length: N (prefill), Nk (decode), all tokens (varlen)
    d: int
    batch: int
    heads: int
    kv_heads: int
    dtype: str
    causal: bool
    ms: float
    rate: float
    flash_ms: float | None = None
    cudnn_ms: float | None = None

    def vs(self, backend_ms: float | None) -> float | None:
        """The backend's time over fa2tune's (above 1: fa2tune is faster)."""
        return None if backend_ms is None else backend_ms / self.ms

    def rate_of(self, backend_ms: float | None) -> float | None:
        """The backend's rate on the same work (the rate scales as 1 / time)."""
        return None if backend_ms is None else self.rate * self.ms / backend_ms


@dataclass
class Row:
    """One line of the table: a category of shapes, its cells and the bench rows left out."""

    label: str
    unit: str
    length: str = "N"  # what the cells' x is, in the shapes column
    cells: list[Cell] = field(default_factory=list)
    skipped: int = 0  # no fa2tune figure: failed, untuned, or its shipped pick did not verify
    note: str = ""  # appended to the shapes column

    def shapes(self) -> str:
        return describe(self.cells, self.length) + self.note


@dataclass(frozen=True)
class Spread:
    """Smallest, largest and median of some values, and how many there were."""

    lo: float
    hi: float
    median: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        got = sorted(v for v in values if v is not None)
        return cls(got[0], got[-1], statistics.median(got), len(got)) if got else None


@dataclass
class Summary:
    """Everything one run's files hold, parsed."""

    env: dict[str, str]
    prefill: list[Row]
    gqa: list[Row]
    decode: list[Row]
    varlen: list[Row]

    def rows(self) -> list[Row]:
        return [r for r in (*self.prefill, *self.gqa, *self.decode, *self.varlen) if r.cells]


def _length(n: int) -> str:
    """1024 -> "1k", 131072 -> "128k", 37586 -> "37586" (only whole multiples of 1024)."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _join(values: Iterable[Any]) -> str:
    return "/".join(str(v) for v in dict.fromkeys(values))


def describe(cells: Sequence[Cell], length: str = "N") -> str:
    """The shapes a row covers, e.g. ``B=2 H=16, N 1k-16k, fp16/bf16`` (the masks too when
    the cells mix them)."""
    if not cells:
        return ""
    heads = _join(c.heads if c.heads == c.kv_heads else f"{c.heads}:{c.kv_heads}" for c in cells)
    lo, hi = min(c.x for c in cells), max(c.x for c in cells)
    span = _length(lo) if lo == hi else f"{_length(lo)}-{_length(hi)}"
    batches = _join(sorted(c.batch for c in cells))
    masks = {c.causal for c in cells}
    mixed = ", causal+full" if len(masks) > 1 else ""
    return f"B={batches} H={heads}, {length} {span}, {_join(c.dtype for c in cells)}{mixed}"


def read_json(path: Path) -> Any | None:
    if not path.is_file():
        log.warning("%s: not there, its rows are left out", path)
        return None
    return json.loads(path.read_text())


def compare_docs(data: Any) -> list[dict[str, Any]]:
    """The bench/compare_sdpa.py documents of a bundle (a list of them) or of one document."""
    if data is None:
        return []
    return list(data) if isinstance(data, list) else [data]


def compare_cell(r: dict[str, Any], meta: dict[str, Any]) -> Cell | None:
    """A compare_sdpa row as a cell; None unless it timed a stored best (``tuned``: an untuned
    row timed FA2's default, not a shipped pick) and that verified (status OK)."""
    if r.get("status") != "OK" or not r.get("tuned") or not r.get("ms") or not r.get("tflops"):
        return None
    ms = float(r["ms"])

    def backend(name: str) -> float | None:
        ratio = r.get(f"vs_{name}")  # the row keeps the backend's time as its ratio to ours
        return ms * float(ratio) if ratio else None

    heads = int(meta["heads"])
    return Cell(
        x=int(r["n"]), d=int(r["d"]), batch=int(meta["batch"]), heads=heads,
        kv_heads=int(meta.get("kv_heads") or heads), dtype=r["dtype"], causal=bool(r["causal"]),
        ms=ms, rate=float(r["tflops"]), flash_ms=backend("flash"), cudnn_ms=backend("cudnn"),
    )  # fmt: skip


def compare_rows(docs: Sequence[dict[str, Any]], label: Callable[[bool, int], str]) -> list[Row]:
    """compare_sdpa rows grouped by ``label(causal, d)``: non-causal first, then by D."""
    rows: dict[tuple[bool, int], Row] = {}
    for doc in docs:
        for r in doc["rows"]:
            key = (bool(r["causal"]), int(r["d"]))
            row = rows.setdefault(key, Row(label(*key), "TFLOP/s"))
            cell = compare_cell(r, doc["meta"])
            if cell is None:
                row.skipped += 1
            else:
                row.cells.append(cell)
    return [rows[k] for k in sorted(rows)]


def prefill_rows(docs: Sequence[dict[str, Any]]) -> list[Row]:
    return compare_rows(docs, lambda c, d: f"prefill {'causal' if c else 'non-causal'} D={d}")


def gqa_rows(docs: Sequence[dict[str, Any]]) -> list[Row]:
    return compare_rows(docs, lambda c, d: f"GQA prefill {'causal' if c else 'non-causal'} D={d}")


def decode_rows(doc: dict[str, Any] | None) -> list[Row]:
    """decode_bench rows, one table row per D; the rate is K/V bytes read per second."""
    rows: dict[int, Row] = {}
    for r in doc["rows"] if doc else []:
        row = rows.setdefault(int(r["d"]), Row(f"decode Nq={r['nq']} D={r['d']}", "TB/s", "Nk"))
        if not r.get("ms") or not r.get("gbps"):
            row.skipped += 1
            continue
        if "shipped" not in r:
            row.note = " (best of decode_bench's grid)"
        row.cells.append(Cell(
            x=int(r["nk"]), d=int(r["d"]), batch=int(r["batch"]), heads=int(r["heads"]),
            kv_heads=int(r["kv_heads"]), dtype=r["dtype"], causal=False, ms=float(r["ms"]),
            rate=float(r["gbps"]) / 1e3, flash_ms=r.get("flash_ms"), cudnn_ms=r.get("cudnn_ms"),
        ))  # fmt: skip
    return [rows[k] for k in sorted(rows)]


def varlen_ms(r: dict[str, Any]) -> float | None:
    """The shipped pick's time where the row names it (None if that pick did not verify: the
    bench's fastest other candidate is not what fa2tune would run), else the fastest's."""
    if "shipped" not in r:
        return float(r["ms"]) if r.get("ms") else None
    timed = r.get("configs", {}).get(r["shipped"]) or {}
    if timed.get("status") != "OK":
        log.warning("varlen %s: the shipped pick %s has no time (%s)", r["dtype"],
                    r["shipped"], timed.get("status", "not run"))  # fmt: skip
        return None
    return float(timed["ms"])


def varlen_rows(doc: dict[str, Any] | None) -> list[Row]:
    """varlen_bench rows, one table row per D; SDPA's times are on the padded batch."""
    rows: dict[int, Row] = {}
    for r in doc["rows"] if doc else []:
        lens = [int(n) for n in r["lengths"]]
        label = f"varlen {len(lens)} seqs ({min(lens)}-{max(lens)}) D={r['d']}"
        row = rows.setdefault(int(r["d"]), Row(label, "TFLOP/s", "tokens"))
        ms = varlen_ms(r)
        if ms is None:
            row.skipped += 1
            continue
        if "shipped" not in r:
            row.note = " (best of varlen_bench's candidates)"
        padded = r.get("padded") or {}
        row.cells.append(Cell(
            x=sum(lens), d=int(r["d"]), batch=len(lens), heads=int(r["heads"]),
            kv_heads=int(r["kv_heads"]), dtype=r["dtype"], causal=bool(r["causal"]), ms=ms,
            rate=float(r["tflop"]) * 1e3 / ms, flash_ms=padded.get("flash"),
            cudnn_ms=padded.get("cudnn"),
        ))  # fmt: skip
    return [rows[k] for k in sorted(rows)]


def read_env(path: Path) -> dict[str, str]:
    """The ``env.<key>: <value>`` lines of the run's log; an empty value (a tool that was not
    there) is left out, so that what the JSON files record stands."""
    if not path.is_file():
        log.warning("%s: not there; the header takes what the JSON files record", path)
        return {}
    found = (ENV_LINE.match(line) for line in path.read_text().splitlines())
    return {m[1]: m[2].strip() for m in found if m and m[2].strip()}


def env_from_json(prefill: Sequence[dict[str, Any]], decode: Any, varlen: Any) -> dict[str, str]:
    """What the benches' JSON records of the environment (no torch or cuDNN version)."""
    env: dict[str, str] = {}
    for doc in prefill:
        gpu = doc["meta"]["gpu"]
        env.update(date=doc["meta"]["date"], gpu=gpu["name"], driver=gpu["driver_version"],
                   cuda=gpu["cuda_version"])  # fmt: skip
    if varlen:
        env.setdefault("gpu", varlen["gpu"])
        env.setdefault("date", varlen["when"])
    if decode:
        env.setdefault("date", decode["measured_at"])
    return env


def load(src: Path) -> Summary:
    prefill, gqa = (compare_docs(read_json(src / f)) for f in ("prefill.json", "gqa.json"))
    decode, varlen = read_json(src / "decode.json"), read_json(src / "varlen.json")
    # run.log wins: it has every field; the JSON files only fill what it lacks.
    env = {**env_from_json([*prefill, *gqa], decode, varlen), **read_env(src / "run.log")}
    return Summary(env, prefill_rows(prefill), gqa_rows(gqa), decode_rows(decode),
                   varlen_rows(varlen))  # fmt: skip


def header(env: dict[str, str]) -> str:
    def get(key: str) -> str:
        return env.get(key) or "unknown"

    cuda = get("cuda") + (f" (nvcc {env['nvcc']})" if env.get("nvcc") else "")
    return (
        f"Measured {get('date')} on {get('gpu')}: driver {get('driver')}, CUDA {cuda}, "
        f"torch {get('torch')}, cuDNN {get('cudnn')}; commit {get('commit')}; "
        f"`{get('command')}`."
    )


def _spread(values: Iterable[float | None], cells: int) -> str:
    """``lo-hi (median)``, with ``[count]`` when fewer than the row's cells had a value."""
    s = Spread.of(values)
    if s is None:
        return "-"
    where = f" [{s.count}]" if s.count < cells else ""
    return f"{s.lo:.2f}-{s.hi:.2f} ({s.median:.2f}){where}"


def table_line(row: Row) -> str:
    cells = row.cells
    rate = Spread.of(c.rate for c in cells)
    assert rate is not None, "a table row has cells"
    fmt = ".2f" if row.unit == "TB/s" else ".0f"
    cudnn = [v for c in cells if (v := c.vs(c.cudnn_ms)) is not None]
    below = str(sum(v < 1.0 for v in cudnn)) if cudnn else "-"
    return (
        f"| {row.label} | {row.shapes()} | {len(cells)} "
        f"| {rate.lo:{fmt}}-{rate.hi:{fmt}} {row.unit} "
        f"| {_spread((c.vs(c.flash_ms) for c in cells), len(cells))} "
        f"| {_spread(cudnn, len(cells))} | {below} |"
    )


def markdown(summary: Summary) -> str:
    rows = summary.rows()
    lines = [
        header(summary.env),
        "",
        "| category | shapes | cells | fa2tune | vs SDPA flash | vs cuDNN | below 1.0x cuDNN |",
        "|---|---|---|---|---|---|---|",
        *(table_line(r) for r in rows),
        "",
        "fa2tune: the shipped pick for each shape (db/data), re-timed in this run beside SDPA "
        "on the same inputs (CUDA events, L2 flushed, median). vs = the backend's time / "
        "fa2tune's (above 1: fa2tune is faster), min-max (median); [k]: cells where that "
        f"backend ran. Decode: K/V bytes read per second (H200 HBM {H200_PEAK_TBPS} TB/s). "
        "Varlen: SDPA runs the padded batch.",
    ]
    left_out = sum(r.skipped for r in (*summary.prefill, *summary.gqa, *summary.decode,
                                       *summary.varlen))  # fmt: skip
    if left_out:
        lines.append(f"{left_out} bench rows without a fa2tune figure (failed, untuned or "
                     "the shipped pick did not verify) are left out.")  # fmt: skip
    return "\n".join(lines) + "\n"


def _pyplot() -> Any | None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on the GPU hosts
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plots")
        return None
    return plt


#: The lines of both plots: label, colour, and how a cell gives its rate.
SERIES: tuple[tuple[str, str, Callable[[Cell], float | None]], ...] = (
    ("fa2tune", "tab:blue", lambda c: c.rate),
    ("SDPA flash", "tab:orange", lambda c: c.rate_of(c.flash_ms)),
    ("SDPA cuDNN", "tab:green", lambda c: c.rate_of(c.cudnn_ms)),
)
DTYPE_STYLE = {"fp16": "-", "bf16": "--"}


def _draw(ax: Any, cells: Sequence[Cell]) -> None:
    """Every series of ``cells`` against their length, one line style per dtype."""
    for dtype in dict.fromkeys(c.dtype for c in cells):
        sel = sorted((c for c in cells if c.dtype == dtype), key=lambda c: c.x)
        for name, colour, rate in SERIES:
            ys = [rate(c) for c in sel]
            ax.plot([c.x for c in sel], [float("nan") if y is None else y for y in ys],
                    DTYPE_STYLE.get(dtype, ":"), color=colour, marker="o", markersize=3,
                    label=f"{name} {dtype}")  # fmt: skip
    ax.set_xscale("log", base=2)
    xs = sorted({c.x for c in cells})
    if xs:  # ticks at the measured lengths, named as the table names them (1k, 16k)
        ax.set_xticks(xs, [_length(x) for x in xs])
        ax.minorticks_off()
    ax.set_ylim(bottom=0)  # rates read as fractions of each other, so from zero
    ax.grid(alpha=0.3)


def _finish(plt: Any, fig: Any, axes: Any, summary: Summary, what: str, path: Path) -> None:
    """The legend in the first panel, the run's GPU and date over the figure, saved, closed."""
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{summary.env.get('gpu', '')} {summary.env.get('date', '')}: {what}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_prefill(summary: Summary, path: Path) -> bool:
    """Prefill TFLOP/s against N: one panel per (mask, D)."""
    plt = _pyplot()
    cells = [c for r in summary.prefill for c in r.cells]
    if plt is None or not cells:
        return False
    ds = sorted({c.d for c in cells})
    fig, axes = plt.subplots(2, len(ds), figsize=(4.5 * len(ds), 7), squeeze=False)
    for i, causal in enumerate((False, True)):
        for j, d in enumerate(ds):
            ax = axes[i][j]
            _draw(ax, [c for c in cells if c.causal == causal and c.d == d])
            ax.set_title(f"D={d} {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("N")
            ax.set_ylabel("TFLOP/s")
    _finish(plt, fig, axes, summary, f"prefill, {describe(cells)}", path)
    return True


def plot_decode(summary: Summary, path: Path) -> bool:
    """Decode K/V bandwidth against Nk: one panel per batch, with the HBM peak."""
    plt = _pyplot()
    cells = [c for r in summary.decode for c in r.cells]
    if plt is None or not cells:
        return False
    batches = sorted({c.batch for c in cells})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        _draw(ax, [c for c in cells if c.batch == batch])
        ax.axhline(H200_PEAK_TBPS, color="grey", linestyle=":", label="H200 HBM 4.8 TB/s")
        ax.set_ylim(0, max(ax.get_ylim()[1], H200_PEAK_TBPS * 1.05))  # the peak line in view
        ax.set_title(f"B={batch}")
        ax.set_xlabel("Nk (keys in the cache)")
        ax.set_ylabel("K/V TB/s")
    _finish(plt, fig, axes, summary, f"decode, {describe(cells, 'Nk')}", path)
    return True


def summarize(src: Path, out: Path) -> Summary:
    """Parse the run's files under ``src``; write the table and the plots under ``out``."""
    summary = load(src)
    if not summary.rows():
        raise SystemExit(f"{src}: no measured cell in any of the run's JSON files")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(markdown(summary))
    log.info("wrote %s", out / "summary.md")
    for name, plot in zip(PLOTS, (plot_prefill, plot_decode), strict=True):
        if plot(summary, out / name):
            log.info("wrote %s", out / name)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="the run's folder ($OUT)")
    ap.add_argument("--out", type=Path, help="where to write (default: --dir)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    summarize(args.dir, args.out or args.dir)
    log.info("table:\n%s", (args.out or args.dir).joinpath("summary.md").read_text())


if __name__ == "__main__":
    main()
