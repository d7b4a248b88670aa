"""benchmarks/: what the scripts measure, and how they take bad options (workflow fuzzing).

A benchmark script's option that leaves it nothing to measure (no repeats, a size of 0, a
negative count) is refused in one line, as kdml's own commands refuse bad input, not answered
with a traceback or a table of NaNs; what a script reports for an option it offers is
measured, not a silent zero; and a script never writes over a file it did not create.
"""

from __future__ import annotations

import argparse
import importlib
import os
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
    error = refused_line(benchmarks, monkeypatch, capsys, script, argv)
    assert f"argument {option}" in error and "must be at least" in error


def refused_line(benchmarks, monkeypatch, capsys, script: str, argv: list[str]) -> str:
    """The last line a benchmark ``script``'s main says on stderr, refusing ``argv`` with
    exit status 2."""
    module = benchmarks(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


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


@pytest.mark.parametrize("script, argv, option", [
    ("eval_scale", ["--num-samples", "50", "--num-classes", "10", "--stages", "kdml"],
     "--num-samples"),
    ("eval_scoring", ["--points", "60", "--classes", "60"], "--points"),
    ("eval_scoring", ["--points", "300", "--classes", "10"], "--classes"),
    ("chart_retrieval", ["--num-samples", "50", "--num-classes", "10", "--skip-dense"],
     "--num-samples"),
    ("chart_retrieval", ["--dense-samples", "6", "--dense-classes", "2"], "--dense-samples"),
    ("eval_collapsed", ["--points", "3"], "--points"),
    ("eval_collapsed", ["--points", "9", "--classes", "5"], "--points"),
    ("eval_few_classes", ["--sizes", "--points", "3"], "--points"),
])
def test_too_few_points_for_the_scripts_k_are_refused_in_one_line(
        benchmarks, monkeypatch, capsys, script, argv, option):
    """A size of at least 1 that still leaves fewer points than the k a script searches for
    (Recall@100 at SOP scale, Recall@8 by default): today a KdmlError traceback from
    ``retrieval_metrics`` ('K=100 in ks is larger than the 49 available references',
    'embeddings is empty'), after the data are made (eval_scale and chart_retrieval: after
    their baseline processes ran; eval_collapsed with --points 9 and 5 classes keeps 5)."""
    error = refused_line(benchmarks, monkeypatch, capsys, script, argv)
    assert f"argument {option}" in error and "at least" in error, error



def test_the_training_table_on_a_cpu_has_no_nan_for_gpu_memory(benchmarks, capsys):
    """``--quick`` is a smoke test on any device (docs/benchmarks.md), but on a CPU every row's
    'peak GPU memory (GiB)' read 'nan': a device without GPU memory has none to report."""
    module = benchmarks("train_throughput")
    args = argparse.Namespace(backbone="cnn", size=8, batch=4, embedding=4, classes=2,
                              channels_last=False, compile=False, precisions=["fp32"],
                              repeats=1, warmup=0, rounds=1)
    module.train_section(args, torch.device("cpu"))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")
            and "fp32" in line]
    assert len(rows) == 3 and not any("nan" in row for row in rows)
    assert all(row.split(" | ")[4] == "-" for row in rows)


@pytest.mark.parametrize("script, argv, said", [
    ("cpu_autocast", ["--recipe", "jdr", "--dataset", "digits"], "unknown recipe 'jdr'"),
    ("cpu_autocast", ["--dataset", "digits", "train.foo=1"], "unknown config key 'train.foo'"),
    ("probe_fit", ["/no/such/run"], "does not exist"),
])
def test_a_mistyped_recipe_setting_or_run_is_said_in_one_line(
        benchmarks, monkeypatch, capsys, script, argv, said):
    """What kdml's own commands refuse in one line (a KdmlError) had ended these scripts in a
    traceback of 9 to 21 lines."""
    module = benchmarks(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"{script}.py: error: ") and said in error[0]


def test_distributed_scaling_says_a_mistyped_dataset_in_one_line(benchmarks, monkeypatch,
                                                                  capsys):
    """The error is raised in the spawned ranks: the run had ended in a 45-line traceback
    (torch.multiprocessing's, quoting each rank's). Here the ranks run in this process."""
    module = benchmarks("distributed_scaling")

    def start_here(worker, args, nprocs, start_method):
        for rank in range(nprocs):
            worker(rank, *args)

    monkeypatch.setattr(module.mp, "start_processes", start_here)
    monkeypatch.setattr(module.mp, "Manager", lambda: type("M", (), {"dict": dict})())
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # this process's
    monkeypatch.setattr(os, "environ", os.environ.copy())  # a rank sets RANK and the like
    monkeypatch.setattr(sys, "argv", ["distributed_scaling.py", "--dataset", "nosuch"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [error[0]] and "unknown dataset 'nosuch'" in error[0]


def test_a_memory_run_that_is_no_worker_count_is_refused_in_one_line(benchmarks, monkeypatch,
                                                                      capsys):
    """--memory-runs x had been taken, then ended the script in a ValueError traceback
    (int('x')) after the JPEGs were written and the other sections had run."""
    module = benchmarks("data_pipeline")
    monkeypatch.setattr(sys, "argv", ["data_pipeline.py", "--memory-runs", "2", "x"])
    with pytest.raises(SystemExit) as stopped:
        module.parse_args()
    assert stopped.value.code == 2
    assert "argument --memory-runs" in capsys.readouterr().err.strip().splitlines()[-1]
    monkeypatch.setattr(sys, "argv", ["data_pipeline.py", "--memory-runs", "0", "2+mmap"])
    assert module.parse_args().memory_runs == ["0", "2+mmap"]


def test_others_load_is_a_share_of_the_cores_at_most_all(benchmarks, monkeypatch, tmp_path):
    """/proc/stat counts CPU time in clock ticks (10 ms): over a stage of a few milliseconds
    the others' CPU time, one tick or more, had been reported as 516% of both cores."""
    import numpy as np

    module = benchmarks("eval_scale")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "embeddings.npy", rng.standard_normal((120, 4), dtype=np.float32))
    np.save(tmp_path / "labels.npy", np.repeat(np.arange(40), 3))
    readings = iter([100.0, 100.5])  # half a second of others' CPU during a short stage
    monkeypatch.setattr(module, "busy_cpu_seconds", lambda: next(readings))
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    args = argparse.Namespace(chunk_size=None, torch_chunk_size=64)
    result = module.run_stage("faiss", str(tmp_path), args)
    assert 0.0 <= result["others_load"] <= 1.0


@pytest.mark.parametrize("device, said", [("cuda", "no CUDA device"), ("gpu", "not a device")])
def test_jrs_speed_says_a_device_it_cannot_use_in_one_line(benchmarks, monkeypatch, capsys,
                                                          device, said):
    """On a machine without a GPU, --device cuda had ended in torch's 18-line traceback
    ('Torch not compiled with CUDA enabled') once the first section built its tensors."""
    module = benchmarks("jrs_speed")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        module.parse_args(["--device", device])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --device" in error and said in error


@pytest.mark.parametrize("script, given, quick", [
    ("data_pipeline", {"--batch-size": ("batch_size", 8)}, {"images": 128, "repeats": 1}),
    ("train_throughput", {"--batch": ("batch", 4), "--repeats": ("repeats", 3)},
     {"size": 32, "rounds": 2}),
])
def test_quick_keeps_the_options_given_with_it(benchmarks, monkeypatch, script, given, quick):
    """--quick had set its sizes over the options given beside it: ``--quick --batch 4`` ran
    at batch 8, unsaid. Its sizes are defaults now."""
    module = benchmarks(script)
    argv = [text for option, (_, value) in given.items() for text in (option, str(value))]
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--quick", *argv])
    args = vars(module.parse_args())
    assert {dest: args[dest] for dest, _ in given.values()} == dict(given.values())
    assert {dest: args[dest] for dest in quick} == quick


def test_eval_few_classes_says_which_ks_it_did_not_time(benchmarks, monkeypatch, capsys):
    """A k not below a --sizes value had been left out of the table without a word."""
    module = benchmarks("eval_few_classes")
    monkeypatch.setattr(sys, "argv", ["eval_few_classes.py", "--sizes", "200", "300", "--ks",
                                      "8", "250", "--repeats", "1", "--points", "0"])
    module.main()
    out = capsys.readouterr().out
    assert out.count("| 200 | 8 |") == out.count("| 300 | 8 |") == out.count("| 300 | 250 |") == 1
    assert out.rstrip().endswith("not timed (k not below the references): k = 250 of 200")
