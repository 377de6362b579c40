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
#            that holds few of the shipped picks, hence bench/summary_decode.py.
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
  part decode 150 python3 bench/summary_decode.py "$DB" "$OUT/decode.json" "$DECODE_DTYPE" \
    1024,8192,32768,131072 1,8,64
fi

if has varlen; then
  part varlen 120 python3 bench/summary_varlen.py "$DB" "$WORK/varlen" "$VARLEN_DTYPE"
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
