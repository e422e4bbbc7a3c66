#!/usr/bin/env bash
# One-command GPU check of attn_ops: environment, build from source (offline), CUDA tests, CUDA-graph
# tests, compute-sanitizer (memcheck, racecheck), quick GPU benchmarks; every stage logged, a failed
# stage never stops the next, and a summary with each stage's status and time. Docs: docs/gpu_check.md.
#
#   bash benchmarks/gpu/gpu_check.sh OUTDIR
#
# Fits a 10-minute command: the whole run ends within GPU_CHECK_BUDGET seconds (default 540). Each
# stage after the build gets a share of the time left, by weight, capped; a stage whose share is too
# small is skipped ("SKIP (time)"). Stages that run past their share get SIGINT (pytest and the
# benchmarks then still write their reports), then SIGKILL 20 s later.
#
# OUTDIR receives at most 6 files, refreshed after every stage (so a run killed from outside still
# leaves its results so far): summary.md, probes.md, bench_attention.md, bench_decode.md, bench_mla.md
# and logs.tar.gz (every stage's log, trimmed; junit xml; benchmark json; nvidia-smi).
#
# Environment:
#   GPU_CHECK_BUDGET=540        total seconds
#   GPU_CHECK_SKIP=a,b          stages to skip: env build register smoke probes cuda_tests memcheck racecheck
#                               bench_attention bench_decode bench_mla cpu_tests
#   GPU_CHECK_XDIST=14          pytest-xdist workers for the test suites (0: none; used if installed)
#   GPU_CHECK_CPU_TESTS=1       run the CPU cases last with the time left (0: never)
#   PYTHON=python3, MAX_JOBS=16, TORCH_CUDA_ARCH_LIST=9.0 (build)
#   GPU_CHECK_PREBUILT=.prebuilt  a library built ahead by benchmarks/gpu/prebuild_device.sh, used when its
#                               stamp matches (else the usual build)
#   Without a GPU (a dry run of the script itself) the GPU stages skip and the benchmarks run on the
#   CPU at tiny sizes; GPU_CHECK_SKIP=build keeps an existing build.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
OUTDIR=$1
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2

BUDGET=${GPU_CHECK_BUDGET:-540}
# The cuDNN attention backend's cudnn-frontend headers on an offline GPU machine: carried as .cudnn_frontend/include
# (make cudnn-frontend-carry copies them there); without them the build has no cuDNN backend.
if [[ -z "${ATTN_OPS_CUDNN_FRONTEND_INCLUDE:-}" && -e "$REPO/.cudnn_frontend/include/cudnn_frontend.h" ]]; then
  export ATTN_OPS_CUDNN_FRONTEND_INCLUDE="$REPO/.cudnn_frontend/include"
fi
SKIP=",${GPU_CHECK_SKIP:-},"
XDIST=${GPU_CHECK_XDIST:-14}  # the float64 references run on the CPU: workers up to the 16 cores pay
CPU_TESTS=${GPU_CHECK_CPU_TESTS:-1}
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || PY=python
START=$(date +%s)
DEADLINE=$((START + BUDGET))
RESERVE=25                      # seconds kept for the final summary and bundle
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"   # the in-place build wins, editable or not
export MAX_JOBS=${MAX_JOBS:-16}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1

now() { date +%s; }
count_lines() {  # pattern file -> matching lines (0 when none or no file)
  local n
  n=$(grep -c -E "$1" "$2" 2>/dev/null)
  echo "${n:-0}"
}
remaining() { echo $((DEADLINE - $(now))); }
skipped_by_user() { [[ $SKIP == *",$1,"* ]]; }

# ------------------------------------------------------------------------------ stage bookkeeping
# (helpers set globals, never print results: $(...) would run them in a subshell)
NAMES=() STATUS=() SECS=() LIMITS=() NOTES=()
find_stage() {  # name -> IDX (a new row when the stage is not listed yet)
  local i
  for i in "${!NAMES[@]}"; do [[ ${NAMES[$i]} == "$1" ]] && { IDX=$i; return; }; done
  NAMES+=("$1") STATUS+=("") SECS+=("") LIMITS+=("") NOTES+=("")
  IDX=$((${#NAMES[@]} - 1))
}
set_stage() {  # name status secs limit note
  find_stage "$1"
  STATUS[$IDX]=$2 SECS[$IDX]=$3 LIMITS[$IDX]=$4 NOTES[$IDX]=$5
}
stage_status() {
  local i
  for i in "${!NAMES[@]}"; do [[ ${NAMES[$i]} == "$1" ]] && { echo "${STATUS[$i]}"; return; }; done
}
skip_stage() {  # name reason
  set_stage "$1" SKIP "-" "-" "$2"
  echo "== [$1] SKIP: $2"
  finalize
}

# Stage weights (tenths): each stage's limit = time left x its weight / the weights still to come.
declare -A WEIGHT=([smoke]=14 [probes]=16 [cuda_tests]=28 [memcheck]=18 [racecheck]=9 [bench_attention]=18
                   [bench_decode]=10 [bench_mla]=7)
declare -A CAP=([smoke]=150 [probes]=180 [cuda_tests]=300 [memcheck]=200 [racecheck]=120 [bench_attention]=240
                [bench_decode]=150 [bench_mla]=90)
declare -A FLOOR=([smoke]=30 [probes]=40 [cuda_tests]=45 [memcheck]=45 [racecheck]=30 [bench_attention]=50
                  [bench_decode]=40 [bench_mla]=30)
ORDER=(smoke probes cuda_tests memcheck racecheck bench_attention bench_decode bench_mla)
DONE_WEIGHT=","
share() {  # name -> SHARE, the stage's seconds (0: not enough time); its weight is then spent
  local name=$1 w=0 s
  for s in "${ORDER[@]}"; do
    [[ $DONE_WEIGHT == *",$s,"* ]] && continue
    w=$((w + WEIGHT[$s]))
  done
  DONE_WEIGHT+="$name,"
  local avail=$(( $(remaining) - RESERVE ))
  SHARE=$(( w > 0 ? avail * WEIGHT[$name] / w : avail ))
  (( SHARE > CAP[$name] )) && SHARE=${CAP[$name]}
  (( SHARE < FLOOR[$name] )) && SHARE=0
  return 0
}

# run_stage NAME LIMIT CMD...: CMD's output to WORK/NAME.log; SIGINT at LIMIT, SIGKILL 20 s later.
# Sets RC. Status: PASS (0), TIMEOUT (124 / 137), FAIL (rc) unless the caller overrides it.
run_stage() {
  local name=$1 limit=$2
  shift 2
  local t0
  t0=$(now)
  set_stage "$name" RUNNING "-" "$limit" "started $(date -u +%H:%M:%S)"
  finalize
  echo "== [$name] start, limit ${limit} s: $*"
  { echo "# $(date -u '+%F %T UTC') limit ${limit} s"; echo "# $*"; } >"$WORK/$name.log"
  timeout -s INT -k 20 "$limit" "$@" >>"$WORK/$name.log" 2>&1
  RC=$?
  local dt=$(( $(now) - t0 )) st
  case $RC in
    0) st=PASS ;;
    124|137) st=TIMEOUT ;;
    *) st="FAIL (rc $RC)" ;;
  esac
  set_stage "$name" "$st" "$dt" "$limit" ""
  echo "== [$name] $st in ${dt} s"
}

# ------------------------------------------------------------------------------------ reporting
trim_log() {  # big logs: first 300 and last 4000 lines
  local f=$1 dst=$2
  if [[ $(wc -c <"$f") -gt 4000000 ]]; then
    { head -n 300 "$f"; echo "... [trimmed: $(wc -l <"$f") lines in all] ..."; tail -n 4000 "$f"; } >"$dst"
  else
    cp "$f" "$dst"
  fi
}

sanitizer_summary() {  # log -> the ERROR SUMMARY line and the first error lines
  local f=$1
  [[ -f $f ]] || return
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$f" | tail -n 3
  grep -E "^========= +(Invalid|Program hit|Error|Race|Warning|Uninitialized|Barrier|Address|Saved host)" "$f" \
    | sort | uniq -c | sort -rn | head -n 12
  grep -E "^=========     at .*(attn_ops|_kernel|forward|backward|copy_rows|rope|merge)" "$f" \
    | sort | uniq -c | sort -rn | head -n 8
}

finalize() {
  local sum="$WORK/summary.md" i f b xmls stage
  {
    echo "# attn_ops GPU check"
    echo
    echo "- date: $(date -u '+%F %T UTC'); elapsed $(( $(now) - START )) s of a ${BUDGET} s budget"
    echo "- command: \`bash benchmarks/gpu/gpu_check.sh $OUTDIR\` (GPU_CHECK_SKIP=${GPU_CHECK_SKIP:-}, MAX_JOBS=$MAX_JOBS, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
    [[ -f $WORK/facts.txt ]] && sed 's/^/- /' "$WORK/facts.txt"
    echo
    echo "| stage | status | seconds | limit | note |"
    echo "|---|---|---|---|---|"
    for i in "${!NAMES[@]}"; do
      echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECS[$i]} | ${LIMITS[$i]} | ${NOTES[$i]} |"
    done
    echo
    xmls=()
    for f in smoke cuda_tests cpu_tests; do
      [[ -n $(stage_status "$f") && $(stage_status "$f") != SKIP* && $(stage_status "$f") != RUNNING ]] \
        && xmls+=("$WORK/junit_$f.xml")
    done
    if ((${#xmls[@]})); then
      echo "## Tests"
      echo
      "$PY" "$REPO/benchmarks/gpu/junit_summary.py" --max-failures 12 --max-chars 3500 "${xmls[@]}" 2>&1
    fi
    if [[ -f $WORK/crash_trace.log ]]; then
      echo "## crash_trace: native frames of the smoke crash"
      echo
      echo '```'
      grep -E "^=== " "$WORK/crash_trace.log" | grep -v -E "libpython|python3\.[0-9]+ |_pytest|pluggy" | head -n 24 \
        | cut -c1-300
      echo '```'
      echo
    fi
    for f in memcheck racecheck; do
      if [[ -f $WORK/$f.log && $(stage_status "$f") != RUNNING ]]; then
        echo "## $f"
        echo
        echo '```'
        sanitizer_summary "$WORK/$f.log"
        echo '```'
        echo
      fi
    done
    for i in "${!NAMES[@]}"; do
      case ${STATUS[$i]} in
        FAIL*|TIMEOUT)
          f="$WORK/${NAMES[$i]}.log"
          [[ -f $f ]] || continue
          echo "## ${NAMES[$i]}: last lines of its log"
          echo
          echo '```'
          grep -v -E "^\s*$" "$f" | tail -n 25 | cut -c1-300
          echo '```'
          echo ;;
      esac
    done
  } >"$sum" 2>&1
  # OUTDIR: at most 6 files, refreshed in place
  cp "$sum" "$OUTDIR/summary.md"
  for b in probes bench_attention bench_decode bench_mla; do
    [[ -f $WORK/$b.md ]] && cp "$WORK/$b.md" "$OUTDIR/$b.md"
  done
  stage="$WORK/bundle/gpu_check_logs"
  rm -rf "$WORK/bundle"
  mkdir -p "$stage"
  for f in "$WORK"/*; do
    [[ -f $f ]] || continue
    case $f in *.log) trim_log "$f" "$stage/$(basename "$f")" ;; *) cp "$f" "$stage/" ;; esac
  done
  tar -czf "$OUTDIR/logs.tar.gz.tmp" -C "$WORK/bundle" gpu_check_logs 2>/dev/null \
    && mv "$OUTDIR/logs.tar.gz.tmp" "$OUTDIR/logs.tar.gz"
}

on_signal() {
  echo "== interrupted: writing the summary"
  finalize
  cat "$OUTDIR/summary.md"
  exit 130
}
trap on_signal INT TERM

# ----------------------------------------------------------------------------------- (a) env
HAS_CUDA=0
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 && HAS_CUDA=1
if skipped_by_user env; then
  skip_stage env "GPU_CHECK_SKIP"
else
  cat >"$WORK/env_probe.sh" <<'EOF'
set -x
uname -a; nproc; free -g; df -h . | tail -n 1
nvidia-smi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv
command -v nvcc && nvcc --version
ls -d /usr/local/cuda* 2>/dev/null
command -v compute-sanitizer ninja cmake
"$PY" --version
"$PY" -m pip --version
"$PY" - <<'PYEOF'
import importlib, sys, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs",
          round(p.total_memory / 2**30, 1), "GiB", "L2", getattr(p, "L2_cache_size", "?"))
for m in ("setuptools", "wheel", "ninja", "pytest", "xdist", "pytest_timeout", "numpy",
          "expecttest", "transformers", "triton"):
    try:
        mod = importlib.import_module(m)
        print("module", m, getattr(mod, "__version__", "present"))
    except Exception as e:  # noqa: BLE001
        print("module", m, "MISSING", type(e).__name__)
PYEOF
EOF
  run_stage env 60 env PY="$PY" bash "$WORK/env_probe.sh"
  {
    grep -m1 -E "^gpu " "$WORK/env.log" | sed 's/^gpu /GPU: /'
    grep -m1 -E "^torch " "$WORK/env.log" | sed 's/^/versions: /'
    grep -m1 -E "^Python " "$WORK/env.log"
    grep -m1 -E "release [0-9]" "$WORK/env.log" | sed 's/^.*release/nvcc: release/'
    grep -E "^module .*MISSING" "$WORK/env.log" | sed 's/^module /missing module: /'
    echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'no .git')$(git -C "$REPO" status --porcelain 2>/dev/null | grep -q . && echo ' (+ uncommitted changes)')"
  } >"$WORK/facts.txt" 2>/dev/null
  find_stage env; NOTES[$IDX]="CUDA available: $HAS_CUDA"
  nvidia-smi >"$WORK/nvidia-smi.txt" 2>&1 || true
fi
has_module() { "$PY" -c "import $1" >/dev/null 2>&1; }
SANITIZER=$(command -v compute-sanitizer 2>/dev/null \
  || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
        /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
finalize

# --------------------------------------------------------------------------------- (b) build
# A library built ahead on another machine (benchmarks/gpu/prebuild_device.sh) saves the build's 90-120 s of a
# short lease. It is used only when its stamp equals the hash of this tree's build inputs, torch's and
# Python's versions and TORCH_CUDA_ARCH_LIST (benchmarks/gpu/build_stamp.py), and only if it imports.
PREBUILT_NOTE=""
use_prebuilt() {
  local dir=${GPU_CHECK_PREBUILT:-$REPO/.prebuilt} lib want have t0
  [[ -f $dir/stamp ]] || return 1
  t0=$(now)
  lib=$(ls "$dir"/_C.*.so 2>/dev/null | head -n 1)
  want=$(cat "$dir/stamp")
  have=$("$PY" "$REPO/benchmarks/gpu/build_stamp.py" --arch-list "$TORCH_CUDA_ARCH_LIST" 2>/dev/null)
  if [[ -z $lib || $want != "$have" ]]; then
    PREBUILT_NOTE="; $dir not used: its stamp differs from this tree's (other sources, torch, Python or architectures)"
    return 1
  fi
  rm -f "$REPO"/attn_ops/_C.*.so
  cp "$lib" "$REPO/attn_ops/"
  if ! "$PY" -c "import attn_ops" >"$WORK/build.log" 2>&1; then
    rm -f "$REPO/attn_ops/$(basename "$lib")"
    PREBUILT_NOTE="; $dir not used: it did not import (build_prebuilt.log)"
    mv "$WORK/build.log" "$WORK/build_prebuilt.log"
    return 1
  fi
  set_stage build PASS "$(( $(now) - t0 ))" "-" "prebuilt library from $dir (stamp ${want:0:12})"
  echo "== [build] prebuilt library from $dir"
  finalize
}

if skipped_by_user build; then
  skip_stage build "GPU_CHECK_SKIP (existing build kept)"
elif use_prebuilt; then
  :
else
  limit=$(( $(remaining) - RESERVE - 60 ))
  (( limit > 420 )) && limit=420
  (( limit < 30 )) && limit=30
  # ninja's and the compilers' error lines: a compile error, not a packaging problem
  COMPILE_ERROR='FAILED: |ninja: build stopped|\.(cu|cuh|cpp|h)(\([0-9]+\)|:[0-9]+:[0-9]+:) (fatal )?error'
  if has_module setuptools && "$PY" -m pip --version >/dev/null 2>&1; then
    run_stage build "$limit" "$PY" -m pip install -v --no-build-isolation --no-deps --no-index -e .
    how="pip install -e ."
    # setup.py refuses a library with its own static copy of libstdc++ (attn_ops/_linkage.py): a compiler
    # wrapper set up that way (as $CXX on the first GPU machine was) is swapped for the system's compilers.
    if [[ $RC -ne 0 && -x /usr/bin/g++ ]] && grep -q "does not link the shared libstdc++" "$WORK/build.log"; then
      mv "$WORK/build.log" "$WORK/build_static_runtime.log"
      limit=$(( $(remaining) - RESERVE - 60 ))
      (( limit < 30 )) && limit=30
      export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
      run_stage build "$limit" "$PY" -m pip install -v --no-build-isolation --no-deps --no-index -e .
      how="pip install -e . with CXX=/usr/bin/g++ (the first linked libstdc++ statically: build_static_runtime.log)"
    fi
    # pip failed before compiling (offline metadata, missing wheel, read-only site-packages...):
    # fall back to an in-place build; a compile error would only repeat.
    if [[ $RC -ne 0 && $RC -ne 124 && $RC -ne 137 ]] && ! grep -q -E "$COMPILE_ERROR" "$WORK/build.log"; then
      mv "$WORK/build.log" "$WORK/build_pip.log"
      limit=$(( $(remaining) - RESERVE - 60 ))
      (( limit < 30 )) && limit=30
      run_stage build "$limit" "$PY" setup.py build_ext --inplace
      how="pip failed early (build_pip.log); python setup.py build_ext --inplace"
    fi
  else
    run_stage build "$limit" "$PY" setup.py build_ext --inplace
    how="python setup.py build_ext --inplace (no setuptools/pip for an editable install)"
  fi
  has_module ninja || command -v ninja >/dev/null 2>&1 || how+="; no ninja: serial build"
  find_stage build; i=$IDX
  set_stage build "${STATUS[$i]}" "${SECS[$i]}" "${LIMITS[$i]}" "$how; $(count_lines 'warning' "$WORK/build.log") warning lines$PREBUILT_NOTE"
  finalize
fi

# ------------------------------------------------------------- (b2) registration + a first call
cat >"$WORK/register.py" <<'EOF'
import torch, attn_ops
print("attn_ops from", attn_ops.__file__, "library", attn_ops._C.__file__)
from attn_ops import _linkage
needed = _linkage.needed_libraries(attn_ops._C.__file__) or []
print("C++ runtime:", "shared libstdc++" if _linkage.links_shared_libstdcxx(needed)
      else f"NO shared libstdc++ (links {needed})")
ops = ["attention", "attention_backward", "attention_with_kvcache", "kv_cache_append",
       "paged_kv_cache_append", "rotary_embedding", "rotary_embedding_", "mla_cache_append", "mla_decode"]
missing = [op for op in ops if not torch._C._dispatch_has_kernel_for_dispatch_key(f"attn_ops::{op}", "CUDA")]
print("CUDA kernels registered:", len(ops) - len(missing), "of", len(ops), "missing:", missing or "none")
if torch.cuda.is_available():
    q = torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 100, 2, 64, device="cuda", dtype=torch.bfloat16)
    out, lse = attn_ops.attention(q, k, k, causal=True)
    torch.cuda.synchronize()
    print("first CUDA call ok:", tuple(out.shape), out.dtype, "finite:", bool(out.isfinite().all()))
raise SystemExit(1 if missing and torch.cuda.is_available() else 0)
EOF
BUILT=0
if skipped_by_user register; then
  skip_stage register "GPU_CHECK_SKIP"
  BUILT=1
else
  run_stage register 90 "$PY" "$WORK/register.py"
  grep -q "^attn_ops from" "$WORK/register.log" && BUILT=1
  find_stage register; i=$IDX
  set_stage register "${STATUS[$i]}" "${SECS[$i]}" 90 "$(grep -m1 -E '^CUDA kernels registered' "$WORK/register.log" | cut -c1-150)"
  finalize
fi

# ----------------------------------------------------------------------------------- (c) tests
PYTEST_BASE=("$PY" -m pytest -p no:cacheprovider -q -rfE --durations=10 -o junit_family=xunit2)
xdist_args() {
  if (( XDIST > 0 )) && has_module xdist; then echo "-n $XDIST"; fi
}
timeout_args() {  # per-test timeout, when pytest-timeout is installed
  if has_module pytest_timeout; then echo "--timeout $1 --timeout-method thread"; fi
}
pytest_status() {  # name: pytest's exit codes 1 (failures) and 5 (nothing collected) named
  local i
  find_stage "$1"; i=$IDX
  case $RC in
    1) STATUS[$i]="FAIL (tests failed)" ;;
    5) STATUS[$i]="SKIP (no tests ran)" ;;
    2) STATUS[$i]="FAIL (interrupted or usage error)" ;;
  esac
  [[ -f $WORK/junit_$1.xml ]] && NOTES[$i]=$("$PY" - "$WORK/junit_$1.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
c = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for s in ET.parse(sys.argv[1]).getroot().iter("testsuite"):
    for k in c:
        c[k] += int(s.get(k, 0) or 0)
print(f"{c['tests']} tests, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped")
EOF
)
}

# cuda_stage_time NAME: the stage's share of the time in T, or T=0 with the stage recorded as skipped
# (by GPU_CHECK_SKIP, no build, no CUDA, or too little time left).
cuda_stage_time() {
  share "$1"; T=$SHARE
  if skipped_by_user "$1"; then
    skip_stage "$1" "GPU_CHECK_SKIP"; T=0
  elif ((!BUILT || !HAS_CUDA)); then
    skip_stage "$1" "$( ((BUILT)) && echo 'no CUDA' || echo 'no build')"; T=0
  elif ((T == 0)); then
    skip_stage "$1" "time"
  fi
}

GRAPH_TESTS=(tests/test_cuda_smoke.py tests/test_cuda_graphs.py)
if skipped_by_user smoke; then
  share smoke; skip_stage smoke "GPU_CHECK_SKIP"
elif ((!BUILT)); then
  share smoke; skip_stage smoke "no build"
else
  share smoke; t=$SHARE
  if ((t == 0)); then skip_stage smoke "time"; else
    # shellcheck disable=SC2046
    run_stage smoke "$t" "${PYTEST_BASE[@]}" $(timeout_args 90) --junitxml="$WORK/junit_smoke.xml" "${GRAPH_TESTS[@]}"
    SMOKE_RC=$RC
    pytest_status smoke
    finalize
    # A crash (SIGSEGV / SIGABRT): faulthandler names only Python frames. Rerun the file up to the crash with
    # the native handler (tools/native_backtrace.py; pytest's capture off, or it swallows the report)
    # and put the C++ frames in the summary.
    if [[ $SMOKE_RC == 139 || $SMOKE_RC == 134 ]] && (( $(remaining) > RESERVE + 120 )); then
      run_stage crash_trace 60 "$PY" tools/native_backtrace.py -- "$PY" -m pytest -p no:faulthandler \
        -p no:cacheprovider -s -x -q "${GRAPH_TESTS[@]}"
      find_stage crash_trace; i=$IDX
      STATUS[$i]="DONE (rc $RC)"
      NOTES[$i]=$(grep -m1 -E "^=== pc " "$WORK/crash_trace.log" | cut -c1-200)
      finalize
    fi
  fi
fi

# The issue's risk probes (benchmarks/gpu/gpu_probes.py): long-context MLA / attention / cache capacity and the
# dtype x head-dim x length sweep, each against float64; the script stops its sweep at its own budget.
cuda_stage_time probes
if ((T > 0)); then
  run_stage probes "$T" "$PY" benchmarks/gpu/gpu_probes.py --device cuda --time-budget $((T * 3 / 4)) \
    --out "$WORK/probes.md" --json "$WORK/probes.json"
  find_stage probes; i=$IDX
  NOTES[$i]=$(grep -m1 -E "^- checks:" "$WORK/probes.md" 2>/dev/null | sed 's/^- //')
  (( RC == 1 )) && STATUS[$i]="FAIL (probes failed)"
  finalize
fi

cuda_stage_time cuda_tests
if ((T > 0)); then
  # shellcheck disable=SC2046
  run_stage cuda_tests "$T" env TORCHINDUCTOR_COMPILE_THREADS=1 "${PYTEST_BASE[@]}" $(xdist_args) $(timeout_args 180) \
    --junitxml="$WORK/junit_cuda_tests.xml" -k cuda --ignore=tests/test_cuda_smoke.py --ignore=tests/test_cuda_graphs.py tests
  pytest_status cuda_tests
  finalize
fi

# ------------------------------------------------------------------------------ (d) sanitizers
sanitizer_status() {  # name: errors found -> FAIL with the count
  local i n
  find_stage "$1"; i=$IDX
  n=$(grep -E "ERROR SUMMARY: [0-9]+" "$WORK/$1.log" | tail -n 1 | grep -o -E "[0-9]+ error" | grep -o -E "[0-9]+")
  [[ -n $n ]] && NOTES[$i]="$n sanitizer errors"
  if [[ -n $n && $n != 0 ]]; then STATUS[$i]="FAIL ($n errors)"; fi
  (( RC == 1 )) && [[ -z $n || $n == 0 ]] && STATUS[$i]="FAIL (tests failed, sanitizer clean)"
}
for tool in memcheck racecheck; do
  if skipped_by_user $tool; then
    share $tool; skip_stage $tool "GPU_CHECK_SKIP"; continue
  elif ((!BUILT || !HAS_CUDA)); then
    share $tool; skip_stage $tool "$( ((BUILT)) && echo 'no CUDA' || echo 'no build')"; continue
  elif [[ -z $SANITIZER ]]; then
    share $tool; skip_stage $tool "compute-sanitizer not found"; continue
  fi
  share $tool; t=$SHARE
  if ((t == 0)); then skip_stage $tool "time"; continue; fi
  if [[ $tool == memcheck ]]; then
    # no caching allocator: every tensor is its own allocation, so an overrun is seen
    run_stage memcheck "$t" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool memcheck --leak-check no \
      --report-api-errors no --print-limit 40 --error-exitcode 86 --target-processes all \
      "${PYTEST_BASE[@]}" tests/test_cuda_smoke.py
  else
    run_stage racecheck "$t" "$SANITIZER" --tool racecheck --racecheck-report analysis --print-limit 40 \
      --error-exitcode 86 --target-processes all \
      "${PYTEST_BASE[@]}" tests/test_cuda_smoke.py -k test_racecheck_attention
  fi
  sanitizer_status $tool
  finalize
done

# ------------------------------------------------------------------------------ (e) benchmarks
if ((HAS_CUDA)); then
  BENCH_DEV=(--device cuda --quick)
  TINY_ATT=() TINY_DEC=() TINY_MLA=()
else  # dry run on a CPU: the scripts at tiny sizes
  BENCH_DEV=(--device cpu --quick --repeats 2)
  TINY_ATT=(--seqlen 64 --hq 4 --hkv 2 --head-dim 32 --dtype float32)
  TINY_DEC=(--batch 2 --context 64 --hq 4 --hkv 2 --head-dim 32 --append-batch 2 --append-tokens 32)
  TINY_MLA=(--batch 2 --context 128 --heads 4 --kv-lora-rank 64 --rope-dim 16)
fi
for b in bench_attention bench_decode bench_mla; do
  if skipped_by_user $b; then
    share $b; skip_stage $b "GPU_CHECK_SKIP"; continue
  elif ((!BUILT)); then
    share $b; skip_stage $b "no build"; continue
  fi
  share $b; t=$SHARE
  if ((t == 0)); then skip_stage $b "time"; continue; fi
  case $b in
    bench_attention) extra=("${TINY_ATT[@]}") ;;
    bench_decode) extra=("${TINY_DEC[@]}") ;;
    *) extra=("${TINY_MLA[@]}") ;;
  esac
  # the script's own budget ends it (its report written) well before the stage's SIGINT
  run_stage $b "$t" "$PY" "benchmarks/$b.py" "${BENCH_DEV[@]}" "${extra[@]}" --time-budget $((t * 2 / 3)) \
    --out "$WORK/$b.md" --json "$WORK/$b.json"
  find_stage $b; i=$IDX
  NOTES[$i]="$(count_lines '^\| ' "$WORK/$b.md") table lines; $(count_lines ' -> (n/a|OOM|error|slow|skipped)' "$WORK/$b.log") entries skipped or failed"
  finalize
done

# ------------------------------------------------------------------- CPU cases, with the time left
if [[ $CPU_TESTS == 1 ]] && ! skipped_by_user cpu_tests && ((BUILT)); then
  t=$(( $(remaining) - RESERVE ))
  if ((t >= 90)); then
    # shellcheck disable=SC2046
    run_stage cpu_tests "$t" "${PYTEST_BASE[@]}" $(xdist_args) $(timeout_args 300) \
      --junitxml="$WORK/junit_cpu_tests.xml" -k "not cuda" tests
    pytest_status cpu_tests
    find_stage cpu_tests; i=$IDX
    [[ ${STATUS[$i]} == TIMEOUT ]] && STATUS[$i]="PARTIAL (time left used up)"
  else
    skip_stage cpu_tests "time ($t s left; CI runs them)"
  fi
else
  skip_stage cpu_tests "GPU_CHECK_CPU_TESTS=$CPU_TESTS / GPU_CHECK_SKIP / no build"
fi

finalize
echo
cat "$OUTDIR/summary.md"
echo
echo "files in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
rm -rf "$WORK"
exit 0
