#!/usr/bin/env bash
# All of benchmarks/gpu_checks.sh in one device call, for a session whose device time (15 minutes,
# the machine's start included) allows one call: the throughput part first, on a quiet GPU; then
# the test suite and the torchrun part while the neurve part trains beside them (accuracy does
# not depend on what shares the machine; the throughput timings would). Every part runs under a
# deadline, so the logs are gathered into $OUT even when a part runs out of time: a neurve part
# stopped early still leaves charts 16's JSON if that setting finished.
#
#   BUDGET=500 bash benchmarks/gpu_session.sh            # seconds for all parts together
#   QUICK=1 WHEELS=none PYTHON=.venv/bin/python BUDGET=200 bash benchmarks/gpu_session.sh  # dry run
#
# Carry .whl (../shared/tools/gpu-wheels.sh) and .neurve (the authors' source) with the call,
# and give the call a timeout_s about 60 s above BUDGET.
set -u
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
checks=${GPU_CHECKS:-benchmarks/gpu_checks.sh}  # a stand-in, in its test
out=${OUT:-gpu-checks}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT  # after the copy into $out below
start=$(date +%s)
deadline=$((start + ${BUDGET:-500}))
seconds_left() { echo $((deadline - $(date +%s))); }
note() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$logs/session.txt"; }
# at most `cap` seconds, and never past the deadline
part() {
  local cap=$1 name=$2 left
  left=$(seconds_left)
  if ((left < 10)); then note "$name: not run, the budget is spent"; return; fi
  OUT=$logs PYTHON=$python timeout $((left < cap ? left : cap)) \
    bash "$checks" "$name" > "$logs/$name.out" 2>&1
  note "$name: exit status $?"
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
# pytest-xdist, where installed, spreads the suite over the CPUs the neurve loader leaves
if "$python" -c "import xdist" 2>/dev/null; then export PYTEST_ADDOPTS="-n $(($(nproc) > 8 ? $(nproc) - 6 : 1))"; fi
part 240 tests
part 90 torchrun
if [[ -n ${neurve:-} ]]; then wait "$neurve"; fi
mkdir -p "$out"
cp "$logs"/*.out "$logs"/neurve-charts*.json "$logs/session.txt" "$out"/ 2>/dev/null
ls -l "$out"
