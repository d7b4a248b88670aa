"""benchmarks/gpu_session.sh: every part of gpu_checks.sh in one device call, under a deadline.

Run here with a stand-in for gpu_checks.sh whose parts only leave traces, so that what is
checked is the session's own part: the order, the neurve part training beside the tests, the
deadline, and the logs gathered into $OUT.
"""

from __future__ import annotations

import os
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
    assert "tests: exit status 0" in session and "torchrun: exit status 0" in session
    assert seconds < 30


def test_a_session_stopped_from_outside_keeps_the_logs_of_what_ran(tmp_path):
    """The logs had gone to a scratch folder copied into $OUT at the end, and removed on exit:
    a device call stopped at its timeout returned nothing."""
    checks = tmp_path / "checks.sh"
    checks.write_text(STAND_IN)
    (tmp_path / "seen").mkdir()
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECKS": str(checks), "SEEN": str(tmp_path / "seen"),
           "OUT": str(out), "BUDGET": "60", "WHEELS": "none", "NEURVE": str(tmp_path),
           "PYTHON": sys.executable}
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
