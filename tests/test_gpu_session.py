"""benchmarks/gpu_session.sh: every part of gpu_checks.sh in one device call, under a deadline.

Run here with a stand-in for gpu_checks.sh whose parts only leave traces, so that what is
checked is the session's own part: the order, the neurve part training beside the tests, the
deadline, and the logs gathered into $OUT.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A part writes its name and the parts it saw running (a file per running part in $SEEN).
STAND_IN = """#!/usr/bin/env bash
part=$1
touch "$SEEN/$part"
echo "$part ran beside: $(ls "$SEEN" | tr '\\n' ' ')"
case $part in
  neurve)
    echo '{"rows": []}' > "$OUT/neurve-charts16.json"
    exec sleep 60 ;;  # the deadline stops it
  *) sleep 1 ;;
esac
rm "$SEEN/$part"
"""

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a bash script")


def run_session(tmp_path: Path, budget: int, neurve: Path) -> tuple[Path, float]:
    checks = tmp_path / "checks.sh"
    checks.write_text(STAND_IN)
    seen = tmp_path / "seen"
    seen.mkdir()
    out = tmp_path / "out"
    scratch = tmp_path / "scratch"  # nothing goes to a scratch folder: every log to $OUT
    scratch.mkdir()
    env = {**os.environ, "GPU_CHECKS": str(checks), "SEEN": str(seen), "OUT": str(out),
           "BUDGET": str(budget), "WHEELS": "none", "NEURVE": str(neurve),
           "PYTHON": sys.executable, "TMPDIR": str(scratch)}
    start = time.perf_counter()
    subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh")], env=env, check=True,
                   capture_output=True, timeout=60)
    assert list(scratch.iterdir()) == []
    return out, time.perf_counter() - start


def test_the_session_runs_every_part_and_stops_neurve_at_the_deadline(tmp_path):
    out, seconds = run_session(tmp_path, budget=14, neurve=tmp_path)
    assert sorted(path.name for path in out.iterdir()) == [
        "neurve-charts16.json", "neurve.out", "session.txt", "tests.out", "throughput.out",
        "torchrun.out"]
    # throughput alone on the machine; the tests and torchrun beside neurve
    assert (out / "throughput.out").read_text().split() == ["throughput", "ran", "beside:",
                                                            "throughput"]
    for part in ("tests", "torchrun"):
        assert "neurve" in (out / f"{part}.out").read_text()
    session = (out / "session.txt").read_text()
    assert "neurve: exit status 124" in session  # timeout's status: stopped at the deadline
    # said as such, not left to read as a failure
    assert re.search(r"neurve: exit status 124, stopped at its limit of \d+ s", session)
    assert "tests: exit status 0" in session and "torchrun: exit status 0" in session
    assert seconds < 30


def test_a_session_stopped_from_outside_keeps_the_logs_of_what_ran(tmp_path):
    """The logs had gone to a scratch folder copied into $OUT at the end, and removed on exit:
    a device call stopped at its timeout returned nothing."""
    checks = tmp_path / "checks.sh"
    checks.write_text(STAND_IN)
    (tmp_path / "seen").mkdir()
    out = tmp_path / "out"
    # the kill skips the script's removal of its scratch folder: here, not in /tmp
    env = {**os.environ, "GPU_CHECKS": str(checks), "SEEN": str(tmp_path / "seen"),
           "OUT": str(out), "BUDGET": "60", "WHEELS": "none", "NEURVE": str(tmp_path),
           "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    session = subprocess.Popen(["bash", str(ROOT / "benchmarks" / "gpu_session.sh")], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    time.sleep(4)  # throughput and tests have run; neurve sleeps beside torchrun or later
    os.killpg(session.pid, 9)
    session.wait()
    assert "throughput: exit status 0" in (out / "session.txt").read_text()
    assert (out / "throughput.out").read_text().startswith("throughput ran beside:")
    assert (out / "neurve-charts16.json").is_file()


def test_without_neurve_source_the_session_says_so_and_runs_the_rest(tmp_path):
    out, _ = run_session(tmp_path, budget=20, neurve=tmp_path / "missing")
    session = (out / "session.txt").read_text()
    assert f"neurve: not run, no source in {tmp_path / 'missing'}" in session
    assert "throughput: exit status 0" in session and "tests: exit status 0" in session
    assert not (out / "neurve.out").exists()


# Stands in for the GPU image's python3 under the real gpu_checks.sh: prints what it was asked
# and writes neurve_side_by_side.py's --out; xdist and timm are "not installed".
FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in "-c import xdist"|"-c import timm") exit 1 ;; esac
echo "python $*"
while (($#)); do
  if [[ $1 == --out && $# -gt 1 ]]; then echo '{"args": {}, "rows": []}' > "$2"; fi
  shift
done
"""

# the device tool's limit on the files it returns from $OUT (/work/.library/device/README.md)
FILES_RETURNED = 8


def test_the_real_checks_leave_no_more_files_in_out_than_the_device_tool_returns(tmp_path):
    """gpu_checks.sh's parts had also teed their output into files of their own in $OUT (the
    machine's lines per part, tests.txt, a throughput file per backbone, torchrun.txt,
    neurve.txt): 16 files in all, of which the device tool returns 8, so half of the one GPU
    call's logs would not have come back."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    (tmp_path / "neurve").mkdir()
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "OUT": str(out), "PYTHON": str(python), "BUDGET": "60",
           "WHEELS": "none", "NEURVE": str(tmp_path / "neurve"), "TMPDIR": str(scratch)}
    for variable in ("QUICK", "GPU_CHECKS", "COPIES"):  # a dry run's, or the session's own
        env.pop(variable, None)
    subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh")], env=env, check=True,
                   capture_output=True, timeout=60)
    files = sorted(path.name for path in out.iterdir())
    assert files == ["neurve-charts0.json", "neurve-charts16.json", "neurve.out", "session.txt",
                     "tests.out", "throughput.out", "torchrun.out"]
    assert len(files) <= FILES_RETURNED
    assert not list(scratch.rglob("*.txt"))  # the parts' copies went to a folder since removed
    # every part's whole output is in its PART.out
    assert "train_throughput.py --backbone timm:resnet50" in (out / "throughput.out").read_text()
    assert "-m pytest" in (out / "tests.out").read_text()
    assert "-m torch.distributed.run" in (out / "torchrun.out").read_text()
    assert (out / "neurve.out").read_text().count("neurve_side_by_side.py") == 2
