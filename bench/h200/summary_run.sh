#!/usr/bin/env bash
# Device run for the README's results table: fa2tune's shipped picks (db/data/*.json, loaded
# into a fresh SQLite file) re-timed beside torch SDPA's backends on the same inputs, in ONE
# call on a 1xH200 host, then bench/summary_table.py on the results. Run from the repository
# root (device tool: `.whl` carried; the tree that travels has no .git, so pass COMMIT):
#
#   COMMIT=<sha> PARTS="prefill gqa decode varlen" bash bench/h200/summary_run.sh
#
# Parts (PARTS picks; estimated wall on a fresh machine, nvcc of the picks included):
#   prefill  bench/compare_sdpa.py, B=2 H=16, causal and not, fp16 and bf16: D 64/128 x N
#            1k/4k/16k and D=256 x N 4k/16k (the only D=256 lengths shipped; elsewhere it would
#            time FA2's default, not a pick): 32 cells in two calls, ~150 s
#   gqa      compare_sdpa.py causal 32:8 D=128, B 1/4/16 (one call each) x N 512/2k/8k,
#            GQA_DTYPE (bf16,fp16): 18 cells, ~95 s (bf16 alone ~60 s)
#   decode   the shipped split-KV pick of each decode shape (Nq=1 32:8 D=128, Nk 1k/8k/32k/128k
#            x B 1/8/64, DECODE_DTYPE bf16) vs SDPA with decode_bench.py's timing: 12 cells,
#            ~50 s. decode_bench.py itself re-searches a grid (~50 configs a shape, minutes)
#            that holds few of the shipped picks, hence the driver below.
#   varlen   bench/varlen_bench.py's default 16 sequences (the shipped batch), VARLEN_DTYPE
#            bf16, causal and not, with the shipped pick added to its candidates: ~30 s
# plus ~25 s of set-up (wheels, database, environment) and ~10 s for the table: ~6 min in all.
# The estimates: compare_sdpa.py costs ~10 s to start (worker, CUDA) and 5-6 s a cell at N <=
# 1k (timing reps of tiny kernels), 1-3 s at 8k and more (2026-12-01-prefill-gqa and
# -decode-retime logs); the 24 shipped decode picks re-timed in 29 s of GPU time without SDPA
# (2026-12-02-variants-followup); varlen_bench.py ran 4 cases in ~45 s
# (2026-12-01-varlen-fa3). BUDGET_S (default 510) caps the whole: each part's timeout is cut
# to what is left, a part with under 15 s left is skipped, and the table is always written.
#
# $OUT gets 8 files (all that come back): prefill.json and gqa.json (lists of compare_sdpa.json
# documents, each meta given kv_heads), decode.json (decode_bench.py's format, each row naming
# its pick), varlen.json (varlen_bench.py's), run.log (env.* lines, then each part's log),
# summary.md, families_vs_sdpa.png, decode_bandwidth.png. Machine paths in them are written as
# <tree>, <site>, <venv>, <data> and <tmp>.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=$(( T0 + ${BUDGET_S:-510} ))
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA2TUNE_CACHE_DIR=/tmp/fa2cache COLUMNS=160
WORK=/tmp/summary; rm -rf $WORK; mkdir -p $WORK
export FA2TUNE_DB_URL=sqlite:///$WORK/shipped.db; DB=$FA2TUNE_DB_URL
PARTS=${PARTS:-prefill gqa decode varlen}
GQA_DTYPE=${GQA_DTYPE:-bf16,fp16}; DECODE_DTYPE=${DECODE_DTYPE:-bf16}; VARLEN_DTYPE=${VARLEN_DTYPE:-bf16}
LOG=$OUT/run.log
has() { [[ " $PARTS " == *" $1 "* ]]; }

# The environment, as env.<key>: <value> lines (summary_table.py's header reads them).
{
  echo "env.date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "env.gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo "env.driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  echo "env.clocks: $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | head -1)"
  echo "env.nvcc: $(nvcc --version 2>/dev/null | grep -o 'V[0-9][0-9.]*' | head -1 | tr -d V)"
  python3 - <<'PY'
import torch

v = torch.backends.cudnn.version() or 0
# cuDNN 9 encodes its version as major*10000 + minor*100 + patch (8.x: major*1000 + ...).
major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
print(f"env.torch: {torch.__version__}\nenv.cuda: {torch.version.cuda}")
print(f"env.cudnn: {major}.{rest // 100}.{rest % 100}" if v else "env.cudnn: none")
PY
  echo "env.commit: ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "env.command: PARTS=\"$PARTS\" GQA_DTYPE=$GQA_DTYPE DECODE_DTYPE=$DECODE_DTYPE VARLEN_DTYPE=$VARLEN_DTYPE bash bench/h200/summary_run.sh"
} > "$LOG" 2>&1

python3 - "$DB" >> "$LOG" 2>&1 <<'PY'
import logging
import sys

from db.shipped import load_shipped_results
from db.store import Store

logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
added = load_shipped_results(Store.from_url(sys.argv[1]))
logging.getLogger("summary_run").info("shipped results: %d measurements loaded", added)
PY

RESERVE=30  # seconds kept back for the table, the plots and the clean-up
part() {  # NAME LIMIT CMD...: CMD under the smaller of LIMIT and what the budget has left
  local name=$1 limit=$2 left t0 rc; shift 2
  left=$(( DEADLINE - RESERVE - $(date +%s) ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 15 ]; then echo "part $name: skipped, the budget is spent" | tee -a "$LOG"; return; fi
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  rc=$?  # 124: cut by its timeout
  echo "part $name: exit $rc in $(( $(date +%s) - t0 )) s (limit $limit s)" | tee -a "$LOG"
}
compare() {  # NAME LIMIT ARGS...: bench/compare_sdpa.py on the shipped database into $WORK/NAME
  local name=$1 limit=$2; shift 2
  part "$name" "$limit" python3 bench/compare_sdpa.py --db "$DB" --out "$WORK/$name" "$@"
}
bundle() {  # KV OUT NAME...: the parts' compare_sdpa.json as one list, each meta given KV
  python3 - "$WORK" "$@" <<'PY'
import json
import sys
from pathlib import Path

work, kv, out, *names = sys.argv[1:]
docs = []
for name in names:  # a part cut by its timeout wrote nothing: the others still count
    path = Path(work) / name / "compare_sdpa.json"
    if path.is_file():
        doc = json.loads(path.read_text())
        doc["meta"]["kv_heads"] = int(kv)  # compare_sdpa.py records batch and heads only
        docs.append(doc)
Path(out).write_text(json.dumps(docs, indent=1))
PY
}

if has prefill; then
  compare prefill_a 240 --d 64,128 --n 1024,4096,16384 --dtype fp16,bf16 --causal both --batch 2 --heads 16
  compare prefill_b 120 --d 256 --n 4096,16384 --dtype fp16,bf16 --causal both --batch 2 --heads 16
  bundle 16 "$OUT/prefill.json" prefill_a prefill_b
fi

if has gqa; then
  for b in 1 4 16; do
    compare gqa_b$b 120 --d 128 --n 512,2048,8192 --dtype "$GQA_DTYPE" --causal yes --batch $b \
      --heads 32 --kv-heads 8
  done
  bundle 8 "$OUT/gqa.json" gqa_b1 gqa_b4 gqa_b16
fi

if has decode; then
  # A file, not python3's stdin: the worker's child is spawned, and re-imports the main module
  # from its path (hence also the main guard).
  cat > "$WORK/decode_shipped.py" <<'PY'
"""The shipped split-KV pick of each decode shape beside SDPA's backends, timed as
bench/decode_bench.py times (its TIMING; the worker times SDPA on the same inputs), written in
decode_bench's JSON format, each row also naming its pick (``shipped``)."""

import datetime as dt
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd() / "bench"))  # run from the repository root
import decode_bench as bench
from codegen.build import build_configs
from core.build_report import BuildReport
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from db.results import BestResult
from db.store import Store
from measure.jobs import BenchJob, MeasureOptions
from measure.worker import BenchWorker

log = logging.getLogger("decode_shipped")


def timed(worker: BenchWorker, p: Problem, built: BuildReport, row: dict[str, Any]) -> MeasureResult:
    """The pick with SDPA on the same inputs; alone if that fails: SDPA's flash and efficient
    backends get K/V expanded to every query head (4x), at B=64 Nk=128k more than the GPU
    holds (2026-11-30 decode bench)."""
    assert built.cubin is not None
    res = worker.measure(BenchJob.make(built.config, built.cubin, p,
                                       MeasureOptions(sdpa=True, timing=bench.TIMING)))
    if res.status == MeasureStatus.OK:
        return res
    row["failures"].append(f"{built.config.name} with SDPA: {res.status} {res.error}")
    return worker.measure(BenchJob.make(built.config, built.cubin, p,
                                        MeasureOptions(timing=bench.TIMING)))


def measure_row(worker: BenchWorker, p: Problem, pick: BestResult | None,
                builds: dict[Any, BuildReport]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "dtype": p.dtype, "nq": p.n, "nk": p.nk, "batch": p.batch, "heads": p.heads,
        "kv_heads": p.kv_heads, "d": p.d, "failures": [], "flush_by": bench.TIMING.flush_by,
    }
    if pick is None:
        row["failures"].append("no shipped result for this shape")
        return row
    cfg, built = pick.config, builds[pick.config]
    row.update(shipped=cfg.name, shipped_ms=pick.median_ms)
    if not built.usable or built.cubin is None:
        row["failures"].append(f"{cfg.name}: {built.status}")
        return row
    res = timed(worker, p, built, row)
    if res.status != MeasureStatus.OK or not res.median_ms:
        row["failures"].append(f"{cfg.name}: {res.status} {res.error}")
        return row
    ms = res.median_ms
    gbps = bench.kv_bytes(p) / (ms * 1e-3) / 1e9
    row.update(best=cfg.name, ms=ms, top=[(cfg.name, ms)], gbps=gbps,
               hbm_fraction=gbps * 1e9 / bench.H200_PEAK_BYTES_PER_S)
    row[f"{cfg.family}_ms"] = ms
    sdpa = res.extra.get("sdpa")
    for name in bench.BACKENDS:
        t = sdpa.get(name) if isinstance(sdpa, dict) else None
        if isinstance(t, dict) and t.get("median_ms"):
            row[f"{name}_ms"] = t["median_ms"]
            row[f"vs_{name}"] = t["median_ms"] / ms
    return row


def main() -> None:
    db, out, dtypes, nks, batches = sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    store = Store.from_url(db)
    rows: list[dict[str, Any]] = []
    with BenchWorker(device=0, job_timeout_s=120.0) as worker:
        assert worker.gpu_info is not None, "the worker reported no GPU"
        gpu = worker.gpu_info.name
        shapes = [
            Problem(gpu=gpu, d=128, n=1, nk=int(nk), batch=int(b), heads=32, kv_heads=8,
                    dtype=t)  # type: ignore[arg-type]
            for t in dtypes.split(",") for nk in nks.split(",") for b in batches.split(",")
        ]
        picks = {p: store.best(gpu, p.d, p.n, p.dtype, False, nk=p.nk, batch=p.batch,
                               heads=p.heads, kv_heads=p.kv_heads) for p in shapes}
        wanted = dict.fromkeys(pick.config for pick in picks.values() if pick is not None)
        builds = {r.config: r for r in build_configs(list(wanted), "sm_90")}
        for p, pick in picks.items():
            rows.append(measure_row(worker, p, pick, builds))
            log.info("%s", rows[-1])
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    Path(out).write_text(json.dumps({"measured_at": stamp, "rows": rows}, indent=1))
    log.info("decode, the shipped picks:\n%s", bench.table(rows))


if __name__ == "__main__":
    main()
PY
  part decode 150 python3 "$WORK/decode_shipped.py" "$DB" "$OUT/decode.json" "$DECODE_DTYPE" \
    1024,8192,32768,131072 1,8,64
fi

if has varlen; then
  cat > "$WORK/varlen_shipped.py" <<'PY'
"""bench/varlen_bench.py with each case's shipped pick among its candidates, so that its time
is in the row (``configs``) and the row names it (``shipped``): the bench's own tiles and
seeds miss some shipped picks (the causal bf16 one at its default lengths)."""

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd() / "bench"))  # run from the repository root
import varlen_bench as bench
from db.store import Store

own_candidates, own_case = bench.candidates, bench.run_case


def with_shipped(store: Store) -> Any:
    """varlen_bench.run_case, the case's shipped pick added to its candidates."""

    def run_case(lens: list[int], heads: int, kv: int, d: int, dtype: Any, causal: bool,
                 fa3: bool) -> dict[str, Any]:
        import torch

        gpu = torch.cuda.get_device_name()
        found = store.best_varlen(gpu, d, dtype, causal, lens, heads, kv)
        pick = found[0].config if found else None

        def candidates(*args: Any) -> list[Any]:
            configs = own_candidates(*args)
            return configs if pick is None or pick in configs else [*configs, pick]

        bench.candidates = candidates  # type: ignore[assignment]  # run_case looks it up
        row: dict[str, Any] = own_case(lens, heads, kv, d, dtype, causal, fa3)
        if found is not None:  # none shipped: the table counts the bench's fastest, and says so
            row.update(shipped=found[0].config.name, shipped_lengths=list(found[1]))
        return row

    return run_case


if __name__ == "__main__":
    db, out, dtypes = sys.argv[1:]
    bench.run_case = with_shipped(Store.from_url(db))  # main looks it up when called
    sys.argv = ["varlen_bench.py", "--out", out, "--dtype", dtypes]
    bench.main()
PY
  part varlen 120 python3 "$WORK/varlen_shipped.py" "$DB" "$WORK/varlen" "$VARLEN_DTYPE"
  [ -f $WORK/varlen/varlen_bench.json ] && cp $WORK/varlen/varlen_bench.json "$OUT/varlen.json"
fi

echo "parts done in $(( $(date +%s) - T0 )) s" | tee -a "$LOG"
python3 bench/summary_table.py --dir "$OUT" > "$WORK/table.log" 2>&1
rc=$?
echo "table: exit $rc (run wall $(( $(date +%s) - T0 )) s)" | tee -a "$LOG"
for f in "$WORK"/*.log; do echo "== ${f##*/}"; cat "$f"; done >> "$LOG"

# Machine paths as the docs write them: the tree, the wheels, the interpreter, fa2tune's data
# directory, then whatever else is under /tmp.
venv=$(python3 -c 'import sys; print(sys.prefix)')
data=$(python3 -c 'import platformdirs; print(platformdirs.user_data_dir("fa2tune"))' 2>/dev/null)
subs=(-e "s|$PWD|<tree>|g" -e "s|/tmp/site|<site>|g")
case $venv in /|/usr|/usr/local) ;; *) subs+=(-e "s|$venv|<venv>|g") ;; esac
[ -n "$data" ] && subs+=(-e "s|$data|<data>|g")
subs+=(-e "s|/tmp/|<tmp>/|g")
for f in "$OUT"/*.json "$OUT"/*.md "$LOG"; do [ -f "$f" ] && sed -i "${subs[@]}" "$f"; done
cat "$OUT/summary.md" 2>/dev/null
ls -l "$OUT"
