"""benchmarks/: what the scripts measure, and how they take bad options (workflow fuzzing).

A benchmark script's option that leaves it nothing to measure (no repeats, a size of 0, a
negative count) is refused in one line, as kdml's own commands refuse bad input, not answered
with a traceback or a table of NaNs; what a script reports for an option it offers is
measured, not a silent zero; and a script never writes over a file it did not create.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def benchmarks(monkeypatch):
    """Import a benchmark script by name, with benchmarks/ on the path as when it runs."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))

    def load(name: str):
        return importlib.import_module(name)

    return load


@pytest.mark.parametrize("script, argv", [
    ("eval_scale", ["--repeats", "0", "--num-samples", "300", "--num-classes", "50",
                    "--stages", "faiss", "--skip-nmi", "--skip-pml"]),
    ("eval_scoring", ["--points", "300", "--classes", "60", "--repeats", "0"]),
    ("eval_few_classes", ["--sizes", "3000", "--ks", "256", "--repeats", "0", "--points", "0"]),
    ("startup", ["--repeats", "0"]),
])
def test_zero_repeats_are_refused_in_one_line(benchmarks, monkeypatch, script, argv):
    """Today: ValueError / StatisticsError tracebacks (min() or median() of no timings), for
    eval_scale only after its single-run stages (NMI, PML: minutes at SOP scale) have run."""
    module = benchmarks(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code not in (0, None)


def test_cpu_autocast_with_zero_repeats_prints_no_nan_table(benchmarks, monkeypatch, capsys):
    """Today: exit status 0 and a table of 'inf' seconds and 'nan' ratios for every precision."""
    module = benchmarks("cpu_autocast")
    monkeypatch.setattr(sys, "argv", ["cpu_autocast.py", "--dataset", "digits", "--repeats", "0",
                                      "--steps", "1"])
    with pytest.raises(SystemExit):
        module.main()
    assert "nan" not in capsys.readouterr().out


def test_distributed_scaling_times_the_gathers_of_an_atlas_recipe(benchmarks):
    """--recipe is offered for any recipe, but only jrd's module-level ``gather`` is wrapped
    (distributed_scaling.py, ``jrd_recipe.gather = timed_gather``): MTriplet, which gathers its
    coordinates, memberships and labels every step (recipes/atlas.py), reports a gather time of
    exactly 0.0 ms and a '0.0%' share."""
    module = benchmarks("distributed_scaling")
    args = argparse.Namespace(recipe="mtriplet", backbone="cnn", device="cpu", batch=20,
                              dataset="digits", size=8, classes=5, steps=1, warmup=0, threads=1)
    assert module.measure(args)["gather"] > 0.0


def test_neurve_side_by_side_leaves_an_existing_file_at_out_alone(benchmarks, monkeypatch,
                                                                   tmp_path):
    """--out is written with ``Path.write_text`` after the first seed has trained, over whatever
    file is there; a file the script did not write is refused up front instead."""
    module = benchmarks("neurve_side_by_side")
    mine = tmp_path / "results.json"
    mine.write_text("my own notes\n")
    trained = []
    monkeypatch.setattr(module, "import_neurve", lambda path: object())
    monkeypatch.setattr(module, "train_neurve", lambda *a, **k: trained.append("neurve"))
    monkeypatch.setattr(module, "neurve_probe", lambda *a, **k: 0.5)
    monkeypatch.setattr(module, "train", lambda *a, **k: {"linear_accuracy": 0.5})
    with pytest.raises(SystemExit):
        module.main(["--neurve", str(tmp_path), "--charts", "0", "--epochs", "1",
                     "--workers", "0", "--device", "cpu", "--train-limit", "8",
                     "--out", str(mine), "--set", "model.backbone=cnn",
                     "model.small_input=false", "eval.nmi=false"])
    assert mine.read_text() == "my own notes\n"
    assert trained == []  # refused before any training


@pytest.mark.parametrize("script, argv, option", [
    ("eval_scoring", ["--points", "0"], "--points"),
    ("eval_scale", ["--num-samples", "-5"], "--num-samples"),
    ("eval_collapsed", ["--dim", "0"], "--dim"),
    ("eval_few_classes", ["--ks", "256", "0"], "--ks"),
    ("chart_retrieval", ["--n-charts", "0"], "--n-charts"),
    ("distributed_scaling", ["--warmup", "-1"], "--warmup"),
    ("train_throughput", ["--batch", "0"], "--batch"),
    ("data_pipeline", ["--workers", "-2"], "--workers"),
    ("jrs_speed", ["--samples-per-class", "0"], "--samples-per-class"),
    ("neurve_side_by_side", ["--epochs", "0"], "--epochs"),
])
def test_a_size_that_leaves_nothing_to_measure_is_refused_in_one_line(
        benchmarks, monkeypatch, capsys, script, argv, option):
    """Today: a traceback from deep in torch, numpy or faiss (a zero batch, dimension or
    sample count), or a negative warm-up or worker count, after the script's set-up."""
    module = benchmarks(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {option}" in error and "must be at least" in error


def test_zero_where_a_benchmark_documents_it_as_off_is_taken(benchmarks):
    """0 warm-up runs and no loader workers are legal choices, not sizes."""
    jrs_speed = benchmarks("jrs_speed")
    assert jrs_speed.parse_args(["--warmup", "0"]).warmup == 0
    side_by_side = benchmarks("neurve_side_by_side")
    assert side_by_side.parse_args(["--charts", "0", "--workers", "0"]).charts == 0


def test_the_profile_counts_only_the_steps_own_host_syncs(benchmarks, monkeypatch, capsys):
    """A CUDA profile (faked: this machine has no GPU) records the benchmark's own
    ``torch.cuda.synchronize`` after the steps and the one the profiler makes on exit, both
    ``cudaDeviceSynchronize``: they had been reported as the steps' (1 per step over 2 steps),
    and each copy counted twice (the runtime's ``cudaMemcpyAsync`` and the device's
    ``Memcpy``)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    module = benchmarks("train_throughput")

    def event(name, start, end, device_type=DeviceType.CPU):
        return SimpleNamespace(name=name, key=name, device_type=device_type,
                               time_range=SimpleNamespace(start=start, end=end))

    events = [event("train_throughput.steps", 30, 115, DeviceType.CUDA),  # its GPU annotation
              event("train_throughput.steps", 0, 100),
              *(event("cudaStreamSynchronize", t, t + 1) for t in (10, 60)),
              *(event("cudaMemcpyAsync", t, t + 1) for t in (20, 70)),
              *(event("Memcpy DtoH (Device -> Pageable)", t, t + 2, DeviceType.CUDA)
                for t in (21, 71)),
              event("cudaDeviceSynchronize", 101, 110),   # the script's synchronize
              event("cudaDeviceSynchronize", 111, 120)]   # the profiler's, on exit

    class Averages(list):
        def table(self, **kwargs):
            return ""

    class FakeProfile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return events

        def key_averages(self):
            names = sorted({e.name for e in events})
            return Averages(SimpleNamespace(key=name, count=sum(e.name == name for e in events))
                            for name in names)

    monkeypatch.setattr("torch.profiler.profile", FakeProfile)
    args = argparse.Namespace(backbone="cnn", size=8, batch=4, embedding=4, classes=2,
                              channels_last=False, compile=False, precisions=["fp32"],
                              repeats=8, warmup=0, profile_rows=1)
    module.profile_section(args, torch.device("cpu"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "per step" in line]
    assert lines == 2 * ["host-device synchronisations and copies per step (CUDA runtime "
                         "calls): cudaMemcpyAsync 1, cudaStreamSynchronize 1"]
