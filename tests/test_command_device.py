"""Where the commands that read a trained run (eval, analyze, embed, index, search, plot) run
its model: ``--device``, else where the run trained if this machine has that device, else
auto. (On a GPU: tests/test_cuda.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdml import cli
from kdml.errors import KdmlError
from kdml.training.build import resolve_device, run_device
from kdml.training.loading import load_model, load_run


@pytest.fixture
def cuda_count(monkeypatch):
    """``set(n)``: torch reports ``n`` CUDA devices (0: none), without one being here."""
    def set_count(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    return set_count


@pytest.mark.parametrize(("requested", "trained_on", "gpus", "expected"), [
    (None, "cpu", 2, "cpu"),        # a run pinned to the CPU stays there on a GPU machine
    (None, "auto", 0, "cpu"),
    (None, "auto", 1, "cuda"),
    (None, "cuda:1", 2, "cuda:1"),  # the run's own GPU, where this machine has it
    (None, "cuda:1", 1, "cuda"),    # else this machine's
    (None, "cuda", 0, "cpu"),       # a GPU run read on a laptop
    ("cpu", "cuda", 1, "cpu"),
    ("auto", "cpu", 1, "cuda"),
    ("cuda:0", "cpu", 1, "cuda:0"),
])
def test_a_run_s_model_runs_on_the_device_asked_for_else_where_it_trained(
        cuda_count, requested, trained_on, gpus, expected):
    cuda_count(gpus)
    assert run_device(requested, trained_on) == torch.device(expected)


@pytest.mark.parametrize(("option", "name", "gpus", "message"), [
    ("--device", "cuda", 0,
     "--device cuda but no CUDA device is available here; give --device cpu or auto"),
    ("--device", "cuda:2", 2, "--device cuda:2 but this machine has 2 CUDA devices (cuda:0 "
     "to cuda:1); give --device cpu or auto"),
    (None, "cuda:1", 1, "train.device=cuda:1 but this machine has 1 CUDA device (cuda:0); use "
     "cpu or auto"),
    (None, "cuda", 0, "train.device=cuda but no CUDA device is available here; use cpu or "
     "auto"),
])
def test_a_device_this_machine_lacks_is_refused_naming_where_it_was_asked_for(
        cuda_count, option, name, gpus, message):
    """A GPU index past the machine's count failed later, in torch, with a traceback."""
    cuda_count(gpus)
    with pytest.raises(KdmlError) as refused:
        resolve_device(name, option)
    assert str(refused.value) == message
    if option:  # asked for on the command line: refused, not replaced
        with pytest.raises(KdmlError, match=f"^{option} {name} but"):
            run_device(name, "cpu")


def test_a_run_trained_on_the_cpu_is_loaded_there_on_a_gpu_machine(trained_run, cuda_count):
    """What keeps the test suite's CPU-pinned runs bit-repeatable on a CUDA machine."""
    cuda_count(1)
    assert load_run(trained_run).embedder.device == torch.device("cpu")
    assert load_model(trained_run).embedder.device == torch.device("cpu")
    assert next(load_run(trained_run).method.parameters()).device == torch.device("cpu")


READERS = [
    ["eval", "{run}"],
    ["eval", "{run}", "--dataset", "digits"],
    ["analyze", "generalization", "{run}", "--repeats", "2"],
    ["embed", "{run}", "--out", "{tmp}/e.npz"],
    ["index", "{run}", "--out", "{tmp}/index"],
    ["plot", "embedding", "{run}"],
    ["plot", "retrieval", "{run}"],
]


@pytest.mark.parametrize("command", READERS, ids=lambda c: " ".join(c[:2]))
def test_the_commands_that_read_a_run_refuse_a_missing_gpu_in_one_line_writing_nothing(
        trained_run, tmp_path, cuda_count, capsys, command):
    cuda_count(0)
    before = sorted(path.name for path in trained_run.rglob("*"))
    args = [part.format(run=trained_run, tmp=tmp_path) for part in command]
    assert cli.main([*args, "--device", "cuda", "--no-progress"]) == 2
    assert capsys.readouterr().err == ("kdml: error: --device cuda but no CUDA device is "
                                       "available here; give --device cpu or auto\n")
    assert sorted(path.name for path in trained_run.rglob("*")) == before
    assert not list(tmp_path.iterdir())


def test_an_image_query_runs_the_model_on_the_device_asked_for(trained_run, tmp_path,
                                                               cuda_count, capsys):
    """kdml search loads the model only to embed an image or 'inputs'; a precomputed
    embedding's search runs no model, so --device asks nothing of it."""
    index, embedded = tmp_path / "index", tmp_path / "q.npz"
    assert cli.main(["index", str(trained_run), "--out", str(index), "--no-progress"]) == 0
    assert cli.main(["embed", str(trained_run), "--out", str(embedded), "--no-progress"]) == 0
    images = tmp_path / "images.npz"
    test = load_run(trained_run).splits.test
    np.savez(images, inputs=np.stack([test.load(i).numpy() for i in range(2)]))
    capsys.readouterr()
    cuda_count(0)
    search = ["search", str(trained_run), "--index", str(index), "-k", "2", "--json",
              "--device", "cuda", "--query"]
    assert cli.main([*search, str(images)]) == 2
    assert "--device cuda but no CUDA device is available here" in capsys.readouterr().err
    assert cli.main([*search, str(embedded)]) == 0
    on_cpu = ["search", str(trained_run), "--index", str(index), "-k", "2", "--device", "cpu",
              "--query", str(images)]
    assert cli.main(on_cpu) == 0 and "query images.npz[1]" in capsys.readouterr().out


def test_eval_on_the_device_asked_for_scores_what_it_scores_by_default(trained_run, capsys):
    assert cli.main(["eval", str(trained_run), "--no-progress"]) == 0
    default = capsys.readouterr().out
    assert cli.main(["eval", str(trained_run), "--device", "cpu", "--no-progress"]) == 0
    assert capsys.readouterr().out == default


@pytest.mark.parametrize("command", [["eval", "RUN"], ["reproduce", "jrd"],
                                     ["search", "RUN", "--index", "I", "--query", "Q"]])
def test_a_device_name_kdml_does_not_know_is_refused_before_any_work(capsys, command):
    assert cli.main([*command, "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: argument --device: the device must be auto, cpu, "
                          "cuda or cuda:N, got 'gpu' (see 'kdml "), err


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cpu0", "cuda:-1"])
def test_train_device_is_checked_whole(tmp_path, capsys, device):
    """The config checked only its prefix, so "cudax" got past it to the start of training."""
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(tmp_path / "run"),
                     f"train.device={device}"]) == 2
    assert capsys.readouterr().err == (f"kdml: error: train.device must be auto, cpu, cuda or "
                                       f"cuda:N, got {device!r}\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", [
    *READERS, ["search", "{run}", "--index", "{tmp}/index", "--query", "{tmp}/q.npz"]],
    ids=lambda c: " ".join(c[:2]))
def test_the_commands_that_read_a_run_refuse_torchrun(trained_run, tmp_path, monkeypatch,
                                                      capsys, command):
    """Each rank ran the whole command again, all of them on the same GPU, writing the same
    files."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    before = sorted(path.name for path in trained_run.rglob("*"))
    args = [part.format(run=trained_run, tmp=tmp_path) for part in command]
    assert cli.main([*args, "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"kdml: error: kdml {command[0]} runs in one process, "
                                       "on one device (--device): run it without torchrun\n")
    monkeypatch.setenv("RANK", "1")  # every rank meets it alike: rank 0 alone prints it
    assert cli.main([*args, "--no-progress"]) == 2
    assert capsys.readouterr().err == ""
    assert sorted(path.name for path in trained_run.rglob("*")) == before
    assert not list(tmp_path.iterdir())


def test_train_takes_its_device_as_a_flag_as_reproduce_and_the_reading_commands_do(
        tmp_path, capsys, tiny_overrides, cuda_count):
    import yaml

    pinned = [item for item in tiny_overrides if not item.startswith("train.device=")]
    train = ["train", "amsoftmax", "--dataset", "digits", "--no-progress", *pinned]
    run = tmp_path / "run"
    assert cli.main([*train, "--device", "cpu", "train.epochs=1", "--out", str(run)]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["device"] == "cpu"
    capsys.readouterr()
    assert cli.main([*train, "--device", "cpu", "device=auto", "--out",
                     str(tmp_path / "both")]) == 2
    assert capsys.readouterr().err == ("kdml: error: --device and the override device=auto "
                                       "both set train.device; give one\n")
    assert cli.main(["train", "--resume", str(run), "--device", "cpu"]) == 2
    assert "--resume takes only the run folder" in capsys.readouterr().err
    cuda_count(0)
    assert cli.main([*train, "--device", "cuda", "--out", str(tmp_path / "gpu")]) == 2
    assert capsys.readouterr().err == ("kdml: error: train.device=cuda but no CUDA device is "
                                       "available here; use cpu or auto\n")
    assert not (tmp_path / "both").exists() and not (tmp_path / "gpu").exists()
