#!/usr/bin/env bash
# The one GPU command of the benchmark (see BENCHMARKS.md): on one H200, from the repository root,
#
#     bash benchmarks/run_gpu_bench.sh            # results land in $OUT (else benchmarks/results)
#
# 1. prints the GPU, driver, torch and the Python packages the package needs (and which wheels
#    to carry if one is missing: the device cannot reach a registry);
# 2. runs the GPU tests (`pytest -m gpu`, capped; UI/browser/notebook suites are not collected:
#    plotly, ipywidgets and friends are not installed there and not needed here);
# 3. runs `benchmarks/bench_mps_limits.py` (MPS priority and SM share, shown by training step
#    time beside an ungated side task) unless FRL_SKIP_MPS_LIMITS=1;
# 4. runs `freeride-lab bench --quick --emulate-peers` with whatever time is left of
#    FRL_TOTAL_S (default 380 s: the whole script stays under 7 minutes), writing
#    $OUT/<gpu>-<date>.json and .md (<gpu> is the model, e.g. h200 or h100);
# 5. packs the runs' logs (and, separately, their event files; never a secret) into $OUT, plus an
#    `nvidia-smi dmon` trace of power and clocks over the whole benchmark.
# Every step prints a time stamp and the seconds since the start.
#
# Knobs (environment): FRL_TOTAL_S (seconds for the whole script), FRL_RUNS (a comma list of the
# quick profile's runs, e.g. "m4-mps,m8-timeslice" for a second, shorter call), FRL_CASES (the
# bench's --cases), FRL_BENCH_ARGS (more bench options, e.g. "--repeats 3 --real-stage all"),
# FRL_SKIP_TESTS=1 (no pytest), FRL_SKIP_MPS_LIMITS=1, FRL_SKIP_BENCH=1, FRL_RUN_ROOT (where run
# directories go), FRL_TAG (appended to the result's name), FRL_RESUME (a result an earlier call
# cut short: this call measures what it lacks, into that file, and the run knobs above do not
# apply), OUT, PYTHON.
set -uo pipefail

cd "$(dirname "$0")/.."
START=$(date +%s)
TOTAL_S="${FRL_TOTAL_S:-380}"
OUT="${OUT:-$PWD/benchmarks/results}"
PY="${PYTHON:-python3}"
RUNS="${FRL_RUN_ROOT:-/tmp/frl-bench-runs}"   # not under $OUT: checkpoints are gigabytes
GPU_MODEL=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 \
    | tr 'A-Z' 'a-z' | sed -e 's/nvidia//' -e 's/^[^a-z0-9]*//' -e 's/[^a-z0-9].*//')
GPU_MODEL="${GPU_MODEL:-gpu}"
RESULT="$OUT/${GPU_MODEL}-$(date -u +%Y-%m-%d).json"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$RUNS"

elapsed() { echo $(( $(date +%s) - START )); }
stamp() { echo "[$(date +%H:%M:%S) +$(elapsed)s] $*"; }

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,temperature.gpu \
    --format=csv,noheader || stamp "nvidia-smi failed"
"$PY" - <<'EOF'
import importlib, platform, sys
need = {  # module -> wheel to carry if it is missing
    "torch": "torch", "numpy": "numpy", "pandas": "pandas", "psutil": "psutil",
    "pynvml": "nvidia-ml-py", "tqdm": "tqdm",
    "pytest": "pytest", "pytest_timeout": "pytest-timeout", "hypothesis": "hypothesis",
}
missing = []
for module, wheel in need.items():
    try:
        m = importlib.import_module(module)
        print(f"  {module:15s} {getattr(m, '__version__', '?')}")
    except Exception as exc:
        missing.append(wheel)
        print(f"  {module:15s} MISSING ({type(exc).__name__}: {exc})")
import torch
print(f"  python {platform.python_version()}; torch {torch.__version__} CUDA {torch.version.cuda}; "
      f"cuda available {torch.cuda.is_available()}")
if missing:
    print("  carry these wheels (pip download --no-deps -d wheels " + " ".join(missing) + ")")
    sys.exit(3)
EOF
deps=$?
if [ "$deps" -ne 0 ]; then stamp "missing Python packages (above); the bench may fail"; fi

if [ "${FRL_SKIP_TESTS:-0}" = 1 ]; then
    stamp "GPU tests skipped (FRL_SKIP_TESTS=1)"
else
    stamp "GPU tests (pytest -m gpu, at most 150 s)"
    timeout -s INT 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider -o addopts="" \
        --ignore=tests/ui --ignore=tests/browser --ignore=tests/notebooks \
        --continue-on-collection-errors tests 2>&1 | tail -n 30
    stamp "GPU tests exit code ${PIPESTATUS[0]}"
fi

if [ "${FRL_SKIP_MPS_LIMITS:-0}" = 1 ]; then
    stamp "MPS limits bench skipped (FRL_SKIP_MPS_LIMITS=1)"
else
    stamp "MPS limits bench (priority and SM share beside an ungated task, at most 200 s)"
    timeout -s INT 200 "$PY" benchmarks/bench_mps_limits.py --rounds 2 --window-s 6 \
        --out "$OUT/mps-limits-${GPU_MODEL}-$(date -u +%Y-%m-%d).json"
    stamp "MPS limits bench exit code $?"
fi

if [ "${FRL_SKIP_BENCH:-0}" = 1 ]; then
    stamp "bench skipped (FRL_SKIP_BENCH=1)"
    exit 0
fi
BUDGET=$(( TOTAL_S - $(elapsed) - 30 ))
if [ "$BUDGET" -lt 60 ]; then BUDGET=60; fi
nvidia-smi dmon -s pucm -o T > "$OUT/dmon.log" 2>&1 &
DMON=$!
stamp "bench --quick --emulate-peers: time budget ${BUDGET} s"
RUN_ARGS=()
if [ -n "${FRL_RUNS:-}" ]; then
    RUN_ARGS=(--runs "$FRL_RUNS")
    RESULT="${RESULT%.json}-${FRL_RUNS//,/-}.json"
fi
if [ -n "${FRL_CASES:-}" ]; then
    RUN_ARGS+=(--cases "$FRL_CASES")
    RESULT="${RESULT%.json}-${FRL_CASES//,/-}.json"
fi
if [ -n "${FRL_BENCH_ARGS:-}" ]; then
    read -r -a more <<< "$FRL_BENCH_ARGS"
    RUN_ARGS+=("${more[@]}")
fi
if [ -n "${FRL_TAG:-}" ]; then RESULT="${RESULT%.json}-${FRL_TAG}.json"; fi
if [ -n "${FRL_RESUME:-}" ]; then
    timeout -s INT $(( BUDGET + 45 )) "$PY" -m freeride_lab.cli bench --emulate-peers \
        --resume "$FRL_RESUME" --time-budget-s "$BUDGET" --run-root "$RUNS"
else
    timeout -s INT $(( BUDGET + 45 )) "$PY" -m freeride_lab.cli bench --quick --emulate-peers \
        --device cuda --time-budget-s "$BUDGET" --out "$RESULT" --run-root "$RUNS" "${RUN_ARGS[@]}"
fi
code=$?
kill "$DMON" 2>/dev/null
stamp "bench exit code $code"

stamp "packing logs"
# never the runs' secrets (see freeride_lab/lab/archive.py)
"$PY" -m freeride_lab.lab.archive logs "$RUNS" "$OUT/bench-logs.tgz" || stamp "no logs packed"
"$PY" -m freeride_lab.lab.archive events "$RUNS" "$OUT/bench-events.tgz" \
    || stamp "no events packed"
nvidia-smi --query-gpu=temperature.gpu,power.draw,clocks.sm,memory.used --format=csv,noheader
ls -la "$OUT"
stamp "done"
exit "$code"
