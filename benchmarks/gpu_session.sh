#!/usr/bin/env bash
# All of benchmarks/gpu_checks.sh in one device call, for a session whose device time (15 minutes,
# the machine's start included) allows one call: the throughput part first, on a quiet GPU; then
# the test suite and the torchrun part while the neurve part trains beside them (accuracy does
# not depend on what shares the machine; the throughput timings would). Every part runs under a
# deadline, and every log is written straight into $OUT, so what ran comes back even when a part
# runs out of time or the call itself is stopped: a neurve part stopped early still leaves charts
# 16's JSON if that setting finished.
#
#   BUDGET=500 bash benchmarks/gpu_session.sh            # seconds for all parts together
#   QUICK=1 WHEELS=none PYTHON=.venv/bin/python BUDGET=200 bash benchmarks/gpu_session.sh  # dry run
#
# Carry .whl (bash ../shared/tools/gpu-wheels.sh pytest-xdist execnet) and .neurve (the authors'
# source) with the call, and give the call a timeout_s about 60 s above BUDGET.
set -u
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
checks=${GPU_CHECKS:-benchmarks/gpu_checks.sh}  # a stand-in, in its test
out=${OUT:-gpu-checks}
logs=$out  # not a scratch folder copied at the end: a call stopped from outside lost them all
mkdir -p "$logs"
# The device tool returns at most 8 files from $OUT: session.txt, a PART.out per part and
# neurve's two JSON files are 7. gpu_checks.sh's own copies of each part's output (PART.out
# holds all of it) go to a scratch folder instead; they had made 16 files, half of them lost.
copies=$(mktemp -d)
trap 'rm -rf "$copies"' EXIT
start=$(date +%s)
deadline=$((start + ${BUDGET:-500}))
seconds_left() { echo $((deadline - $(date +%s))); }
note() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$logs/session.txt"; }
# at most `cap` seconds, and never past the deadline
part() {
  local cap=$1 name=$2 left limit status
  left=$(seconds_left)
  if ((left < 10)); then note "$name: not run, the budget is spent"; return; fi
  limit=$((left < cap ? left : cap))
  # -k: a part that ignores the TERM (a stuck CUDA call) is killed 20 s later, not orphaned
  OUT=$logs COPIES=$copies PYTHON=$python timeout -k 20 "$limit" \
    bash "$checks" "$name" > "$logs/$name.out" 2>&1
  status=$?
  # timeout's statuses: a part stopped at its limit, not one that failed
  if ((status == 124 || status == 137)); then
    note "$name: exit status $status, stopped at its limit of $limit s"
  else
    note "$name: exit status $status"
  fi
}

wheels=${WHEELS:-.whl}  # WHEELS=none: install nothing (a dry run where the wheels do not fit)
if compgen -G "$wheels/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$wheels"/*.whl || { echo "installing $wheels/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
note "start, $(nproc) CPUs, budget ${BUDGET:-500} s"
part 200 throughput
if [[ -d ${NEURVE:-.neurve} ]]; then
  part 100000 neurve &
  neurve=$!
else
  note "neurve: not run, no source in ${NEURVE:-.neurve}"
fi
# pytest-xdist, where installed (gpu-wheels.sh pytest-xdist execnet), spreads the suite over the
# CPUs the neurve loader leaves, a test file per worker at a time as `make test` does (module
# fixtures built once)
if "$python" -c "import xdist" 2>/dev/null; then
  export PYTEST_ADDOPTS="-n $(($(nproc) > 8 ? $(nproc) - 6 : 1)) --dist loadfile"
fi
part 240 tests
part 90 torchrun
if [[ -n ${neurve:-} ]]; then wait "$neurve"; fi
ls -l "$out"
