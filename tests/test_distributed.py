"""Several processes (gloo, CPU) give the single-process objective: batch regularizers see the
global batch, gradients are exact, only rank 0 writes, evaluation is exact."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from distributed_harness import (
    build_failing_on_rank_1,
    build_on_own_settings,
    collective_failures,
    config_of,
    epoch_weights_with_rank_statistics,
    evaluate_failing_on_rank_0,
    evaluate_untrained,
    loss_non_finite_on_one_rank,
    non_finite_reads,
    run_ranks,
    score_diverged,
    train_steps,
    write_domains,
)

from kdml import cli
from kdml.errors import KdmlError
from kdml.kernels import GaussianMixtureKernel, LaplaceKernel, PolynomialKernel
from kdml.regularizers import JointRepresentationSimilarity
from kdml.regularizers.sharded import sharded_jrs

pytestmark = pytest.mark.slow

# Frozen BatchNorm: statistics of a local batch are not those of the global one (SyncBatchNorm,
# which would make them so, runs on GPUs only). Plain gradient steps: Adam's first steps move
# every parameter by about the learning rate whatever the size of its gradient, so float32
# noise in a near-zero gradient would show as a full step either way.
COMMON = ["train.epochs=1", "train.steps_per_epoch=3", "model.embedding_size=8",
          "model.freeze_bn=true", "eval.nmi=false", "optim.name=sgd", "optim.lr=0.05",
          "optim.proxy_lr=0.05"]


# float32's rounding of a value of size 1: parameters that start at 0 (BatchNorm's biases)
# move by ~1e-4 in three steps, and their float32 gradient sums over a batch split otherwise
# (the SimCLR recipes forward each view on its own: 16 images a rank against 32) differ in the
# last bits, ~1e-8, which is 1e-4 of so small a parameter
FLOAT32_FLOOR = torch.finfo(torch.float32).eps


# Shares of a count above a threshold: a pre-activation within float32 rounding of 0 may count
# on one side in one process and on the other in two, so these compare to an absolute 1e-3 of
# their [0, 1] range. (The SimCLR heads' head_active, 0.333348 against 0.333313, had been rank
# 0's own share of the batch: now every rank's terms must be the same.)
COUNTED_TERMS = ("head_active", "active_triplets")


def assert_same_training(single, double, tolerance=1e-5):
    for rank, terms in enumerate(double["terms_of_every_rank"]):
        assert terms == double["terms"], f"rank {rank} logs other terms than rank 0"
    for name, value in single["terms"].items():
        if name in COUNTED_TERMS:
            assert double["terms"][name] == pytest.approx(value, abs=1e-3), name
        else:
            assert double["terms"][name] == pytest.approx(value, rel=tolerance, abs=1e-7), name
    for key, value in single["state"].items():
        allowed = max(tolerance * float(value.abs().max()), FLOAT32_FLOOR)
        assert float((double["state"][key] - value).abs().max()) <= allowed, key


@pytest.mark.parametrize(("recipe", "overrides"), [
    ("jrd", ["--dataset=digits", "data.batch_size=40"]),
    ("mtriplet", ["--dataset=digits", "data.batch_size=20", "data.samples_per_class=4",
                  "method.n_charts=3"]),
    ("msimclr", ["--dataset=digits", "data.batch_size=32", "method.n_charts=3",
                 "model.backbone=cnn", "model.small_input=false"]),
    ("dtml", ["--dataset=NPZ", "data.batch_size=16", "data.samples_per_class=4",
              "method.k1=2", "method.k2=3"]),
    # any recipe's domain MMD (DomainAdaptedMethod) between the gathered source and target
    ("amsoftmax", ["--dataset=NPZ", "data.batch_size=16", "domain.beta=1"]),
    ("triplet", ["--dataset=digits", "data.batch_size=20", "data.samples_per_class=4"]),
    ("ddml-logistic", ["--dataset=NPZ", "data.batch_size=16"]),
])
def test_two_processes_train_as_one_on_the_concatenated_batch(tmp_path, recipe, overrides):
    features = write_domains(tmp_path / "domains.npz")
    overrides = [item.replace("--dataset=NPZ", f"data.dataset=npz:{features}")
                 .replace("--dataset=", "data.dataset=") for item in overrides]
    single = run_ranks(1, train_steps, recipe, [*COMMON, *overrides], tmp_path=tmp_path)
    double = run_ranks(2, train_steps, recipe, [*COMMON, *overrides], tmp_path=tmp_path)
    assert_same_training(single, double)


def test_sharded_kernels_equal_the_full_gather(tmp_path):
    overrides = [*COMMON, "data.dataset=digits", "data.batch_size=40"]
    gathered = run_ranks(2, train_steps, "jrd", overrides, tmp_path=tmp_path)
    sharded = run_ranks(2, train_steps, "jrd", [*overrides, "train.sharded_kernels=true"],
                        tmp_path=tmp_path)
    assert_same_training(gathered, sharded)


@pytest.mark.parametrize("kernel", ["gaussian", "polynomial", "laplace"])
def test_sharded_jrs_value_and_gradient_in_one_process(kernel):
    """With one process the sharded form computes every row itself: value and gradient must be
    JRS's (float64)."""
    generator = torch.Generator().manual_seed(0)
    layers = [torch.randn(12, 6, generator=generator, dtype=torch.float64, requires_grad=True)
              for _ in range(2)]
    labels = torch.arange(4).repeat_interleave(3)
    kernels = {"gaussian": [GaussianMixtureKernel(3), GaussianMixtureKernel(1)],
               "polynomial": [PolynomialKernel(2), PolynomialKernel(2)],
               "laplace": [LaplaceKernel(), LaplaceKernel()]}[kernel]
    full = JointRepresentationSimilarity(kernels)(layers, labels)
    full_grads = torch.autograd.grad(full, layers)
    sharded = sharded_jrs(kernels, layers, labels)
    sharded_grads = torch.autograd.grad(sharded, layers)
    assert sharded.item() == pytest.approx(full.item(), rel=1e-12)
    for a, b in zip(sharded_grads, full_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("representations", "labels", "message"), [
    ([torch.randn(4, 3)], torch.zeros(5, dtype=torch.long), "representation 0 must be [M, D]"),
    ([torch.randn(4, 3)], torch.zeros(4), "labels must be integers"),
    (torch.randn(4, 3), torch.zeros(4, dtype=torch.long), "a sequence of representations"),
])
def test_sharded_jrs_refuses_a_malformed_batch_as_jrs_does(representations, labels, message):
    """The sharded form is checked as JRS is (it skipped the check: a mismatched batch failed
    inside its masked sum, and float labels were taken)."""
    with pytest.raises(KdmlError, match=rf"^sharded JRS.*{re.escape(message)}"):
        sharded_jrs([GaussianMixtureKernel(3)], representations, labels)


@pytest.mark.parametrize(("recipe", "extra"), [
    ("amsoftmax", []),
    ("mtriplet", []),
    ("msimclr", []),
    # 1077 test samples: rank_share pads rank 1's share with a duplicate, _gathered drops it
    ("amsoftmax", ["data.train_classes=4"]),
], ids=["amsoftmax", "mtriplet", "msimclr", "amsoftmax-odd-test-set"])
def test_distributed_evaluation_equals_the_single_process_one(tmp_path, recipe, extra):
    overrides = ["data.dataset=digits", "model.embedding_size=8", "model.backbone=cnn",
                 "method.n_charts=3" if recipe != "amsoftmax" else "model.freeze_bn=false",
                 *extra]
    if recipe == "msimclr":
        overrides.append("model.small_input=false")
    single = run_ranks(1, evaluate_untrained, recipe, overrides, tmp_path=tmp_path)
    double = run_ranks(2, evaluate_untrained, recipe, overrides, tmp_path=tmp_path)
    assert double == single


def test_an_error_scoring_on_rank_0_stops_the_other_ranks(tmp_path):
    """Rank 0 scores the gathered embeddings; when that fails, the other ranks stop quietly
    (rank 0 reports it) instead of waiting in a broadcast for metrics that never come."""
    overrides = ["data.dataset=digits", "model.embedding_size=8", "eval.nmi=false"]
    run_ranks(2, evaluate_failing_on_rank_0, "amsoftmax", overrides, str(tmp_path),
              tmp_path=tmp_path)
    assert (tmp_path / "rank-0.txt").read_text() == "KdmlError: scoring failed"
    assert (tmp_path / "rank-1.txt").read_text() == "QuietExit: scoring failed"


# ----------------------------------------------------------------------------- torchrun

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", "-m", "kdml"]
# 5 steps an epoch, of the 22 that 901 digits in batches of 40 give: what these runs check
# (the one-process run's numbers, one run folder, a kill and its resume) needs no more
RUN = ["train", "jrd", "--dataset", "digits", "--no-progress", "train.epochs=2",
       "train.steps_per_epoch=5", "data.batch_size=40", "model.embedding_size=8",
       "model.freeze_bn=true", "eval.nmi=false", "train.device=cpu"]


@pytest.fixture(scope="module", autouse=True)
def launchers_temporary_folder(tmp_path_factory):
    """TMPDIR for the processes these tests start: torchrun leaves a folder of its own
    (``torchelastic_*``, empty log folders) in the temporary folder at every launch, which
    had piled up in /tmp, 7 a suite run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp_path_factory.mktemp("tmpdir")))
        yield


def torchrun(*args, cwd, script: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``torchrun -m kdml ARGS`` in 2 processes, or ``torchrun SCRIPT ARGS``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    launcher = TORCHRUN if script is None else [*TORCHRUN[:-2], str(script)]
    return subprocess.run([*launcher, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory):
    """The 2-process run of RUN, trained once for the tests that read it. Run by
    ``NATIVE_THREADS`` (``cli.main()``, as ``-m kdml`` calls it, then a count of
    the threads it left), so that the test of those threads needs no torchrun job of its own:
    each starts three Pythons that import torch."""
    folder = tmp_path_factory.mktemp("torchrun")
    script = tmp_path_factory.mktemp("script") / "count_threads.py"
    script.write_text(NATIVE_THREADS)
    result = torchrun(*RUN, "--out", folder / "run", cwd=folder, script=script)
    assert result.returncode == 0, result.stderr[-2000:]
    return folder, result


def test_torchrun_gives_the_single_process_run_and_one_run_folder(torchrun_run, tmp_path):
    folder, result = torchrun_run
    assert sorted(path.name for path in folder.iterdir()) == ["run"]  # nothing else written
    assert result.stdout.count("Test metrics (") == 1  # rank 0 alone prints
    single = tmp_path / "single"
    assert cli.main([*RUN, "--out", str(single)]) == 0
    runs = [json.loads((path / "metrics.json").read_text()) for path in (single, folder / "run")]
    first_loss = [run["epochs"][0]["train/loss"] for run in runs]
    assert first_loss[1] == pytest.approx(first_loss[0], rel=1e-5)
    # float32 sums run in another order on two processes: the final embeddings differ in the
    # last digits, so a test query may change its neighbour order at most
    for key, value in runs[0]["final"].items():
        assert runs[1]["final"][key] == pytest.approx(value, abs=2 / 896), key


def test_batchnorm_layers_that_train_per_process_are_named_once(torchrun_run, tmp_path):
    """Two processes train the one-process run only where no BatchNorm layer normalises a
    process's share of the batch: a run that has them says so, once, in train.log too; and
    scores the model it saves."""
    _, frozen = torchrun_run
    assert "BatchNorm" not in frozen.stderr
    result = torchrun("train", "jrd", "--dataset", "digits", "--no-progress", "train.epochs=1",
                      "train.steps_per_epoch=1", "data.batch_size=40", "eval.nmi=false",
                      "train.device=cpu", "--out", tmp_path / "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    warned = [line for line in result.stderr.splitlines() if "BatchNorm" in line]
    assert len(warned) == 1 and warned[0].startswith(
        "kdml: warning: the model's BatchNorm layers train on each process's share of the "
        "batch (20 of 40 samples)"), warned
    assert (tmp_path / "run" / "train.log").read_text().count("BatchNorm layers") == 1
    # the scores training writes are the saved model's (rank 0's statistics), as kdml eval
    # gives them: each rank had scored its slice of the test set with its own (R@1 0.9810
    # against 0.9821 here)
    assert cli.main(["eval", str(tmp_path / "run")]) == 0
    trained, evaluated = (json.loads((tmp_path / "run" / name).read_text())
                          for name in ("metrics.json", "eval.json"))
    assert trained["final"] == pytest.approx(evaluated["metrics"], abs=1e-4)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(command name)"
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def kill_job(launcher: subprocess.Popen) -> None:
    """SIGKILL a torchrun job, launcher and ranks, and wait until the ranks are gone: torchrun
    starts each rank in a session of its own, so a kill of its process group alone leaves the
    ranks training on."""
    ranks = children(launcher.pid)
    assert ranks, "torchrun has not started its ranks"
    for pid in [*ranks, launcher.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    launcher.wait()
    deadline = time.time() + 30
    while any(alive(pid) for pid in ranks) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in ranks), "a rank outlived the kill"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: neither gone nor a zombie (dead, waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ``cli.main()``, as ``-m kdml`` calls it, whose ranks wait once epoch 2's first
# step is taken, each saying so in a file: the kill then lands mid-epoch 2 on every try (a run
# killed on seeing epoch 1's metrics.json had finished before its kill on a loaded machine)
HELD_IN_EPOCH_2 = """
import os, sys, time
from pathlib import Path
from kdml import cli
from kdml.training import nonfinite, trainer
train_one_epoch, observe = trainer.train_one_epoch, nonfinite.NonFiniteWatch.observe
epoch_now = [0]
def counted(session, epoch, progress):
    epoch_now[0] = epoch
    return train_one_epoch(session, epoch, progress)
def held(watch, step, terms):
    if epoch_now[0] == 2 and step == 1:  # after step 0's backward and optimizer step
        Path(f"rank-{os.environ['RANK']}-in-epoch-2").touch()
        time.sleep(600)  # until killed
    observe(watch, step, terms)
trainer.train_one_epoch, nonfinite.NonFiniteWatch.observe = counted, held
sys.exit(cli.main())
"""


def test_a_killed_torchrun_resumes_to_the_same_result(torchrun_run, tmp_path):
    """A torchrun job of RUN killed (launcher and ranks, SIGKILL) mid-epoch 2, once epoch 1 is
    recorded, and resumed with ``torchrun -m kdml train --resume``: the same metrics.json as
    the module's uninterrupted run."""
    folder, _ = torchrun_run
    script = tmp_path / "held_in_epoch_2.py"
    script.write_text(HELD_IN_EPOCH_2)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([*TORCHRUN[:-2], str(script), *RUN, "--out", str(out)],
                               cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    held = [tmp_path / f"rank-{rank}-in-epoch-2" for rank in (0, 1)]
    deadline = time.time() + 240
    while (not all(path.exists() for path in held) and process.poll() is None
           and time.time() < deadline):
        time.sleep(0.05)
    assert process.poll() is None, "the torchrun job ended before epoch 2's second step"
    kill_job(process)  # torchrun and both ranks, mid-epoch 2
    assert all(path.exists() for path in held), "the ranks did not reach epoch 2's second step"
    assert json.loads((out / "metrics.json").read_text())["final"] is None
    result = torchrun("train", "--resume", out, "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    resumed = json.loads((out / "metrics.json").read_text())
    uninterrupted = json.loads((folder / "run" / "metrics.json").read_text())
    assert resumed == uninterrupted


NATIVE_THREADS = """
import os, sys, threading, time
import torch
def native():  # threads Python did not start (where /proc counts them)
    if not os.path.isdir("/proc/self/task"):
        return 0
    return len(os.listdir("/proc/self/task")) - threading.active_count()
def left():  # a thread told to stop may take a moment to go (1 seen once): wait up to 5 s
    deadline = time.monotonic() + 5
    while native() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"{native() - before} native threads left {named()}"
def named():  # the names of the threads started since `before`, for a failure's message
    python = {str(thread.native_id) for thread in threading.enumerate()}
    names = []
    for task in set(os.listdir("/proc/self/task")) - tasks - python:
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except OSError:  # gone meanwhile
            pass
    return sorted(names)
torch.cuda.is_available()  # a CUDA machine's driver starts its threads here, not in the run
before = native()
tasks = set(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else set()
from kdml import cli
code = cli.main()
print(f"rank {os.environ['RANK']}: exit {code}, {left()}")
"""


# A bug's exception on its way out of cli.main: the threads are counted while it is held, as
# an uncaught one is held (sys.last_exc) until the interpreter shuts down.
BUG_THREADS = NATIVE_THREADS.replace("""code = cli.main()
""", """import kdml.training.trainer as trainer
def a_bug(*args, **kwargs):
    raise ZeroDivisionError("a bug of kdml's")
trainer.score_method = a_bug
try:
    code = cli.main()
except ZeroDivisionError as error:
    code = type(error).__name__
    print(f"rank {os.environ['RANK']}: exit {code}, {left()}")
    sys.exit(0)
""")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize("code", ["0", "ZeroDivisionError"], ids=["finished", "a bug"])
def test_a_torchrun_run_leaves_no_collective_threads_behind(tmp_path, code, request):
    """Once a training returns, its process group is freed with its gloo threads. Left alive
    (torch.distributed.nn.functional's defaults held the group after DistributedDataParallel
    imported it), a thread still finishing a collective when the interpreter shut down aborted
    the rank: "terminate called without an active exception", and torchrun failed a finished
    run. An exception that is not kdml's (a bug) left cli.main with a traceback whose frames
    held the wrapper, and so the group, past teardown: 3 or 4 threads were left per rank, and
    a rank once hung at exit (the reducer's release joining a gloo thread that waited for the
    GIL). Those frames' locals are cleared first; the traceback still prints. The finished
    run is the module's torchrun run, which NATIVE_THREADS trains."""
    if code == "0":
        _, result = request.getfixturevalue("torchrun_run")
    else:
        (tmp_path / "count_threads.py").write_text(BUG_THREADS)
        result = torchrun(*RUN, "train.epochs=1", "train.steps_per_epoch=2", "--out",
                          tmp_path / "run", cwd=tmp_path, script=tmp_path / "count_threads.py")
        assert result.returncode == 0, result.stderr[-2000:]
    # the ranks share one stdout: one's line may run into the other's (seen once, 2026-12-03)
    lines = re.findall(r"rank \d: exit \w+, \d+ native threads left", result.stdout)
    assert sorted(lines) == [
        f"rank {rank}: exit {code}, 0 native threads left" for rank in (0, 1)], result.stdout


def test_a_dead_peer_is_told_from_a_programming_error(tmp_path):
    """A rank killed mid-run (out of memory, say) makes the others' next collective fail in
    gloo: kdml reports that in one line (the traceback would bury the dead rank's output),
    but keeps the traceback of a collective called wrongly."""
    mistake, dead_peer, message = run_ranks(2, collective_failures, tmp_path=tmp_path)
    assert dead_peer, message
    assert not mistake


def test_a_failed_collective_is_reported_in_one_line(tmp_path, monkeypatch, capsys):
    import torch.distributed as dist

    def collective_fails(args):
        raise RuntimeError("[pair.cc:537] Read error [127.0.0.1]:7087: Connection reset by "
                           "peer. This is typically caused by a remote worker hanging\nmore")

    def a_bug(args):
        raise RuntimeError("a bug of kdml's: its traceback is kept")

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        monkeypatch.setitem(cli._COMMANDS, "recipes", collective_fails)
        assert cli.main(["recipes"]) == 1
        assert capsys.readouterr().err == (
            "kdml: error: a collective operation failed, most likely because another process "
            "of this job stopped: its output says why ([pair.cc:537] Read error "
            "[127.0.0.1]:7087: Connection reset by peer. This is typically caused by a remote "
            "worker hanging)\n")
        monkeypatch.setitem(cli._COMMANDS, "recipes", a_bug)
        with pytest.raises(RuntimeError, match="a bug of kdml's"):
            cli.main(["recipes"])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    monkeypatch.setitem(cli._COMMANDS, "recipes", collective_fails)
    with pytest.raises(RuntimeError):  # no process group: not a collective's failure
        cli.main(["recipes"])


def test_errors_are_reported_once(tmp_path):
    result = torchrun("train", "jrd", "--dataset", "digits", "--out", tmp_path / "run",
                      "data.batch_size=41", "train.device=cpu", cwd=tmp_path)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("kdml: error")]
    assert errors == ["kdml: error: data.batch_size=41 is the global batch and must split "
                      "evenly over the 2 processes; set data.batch_size to a multiple of 2, "
                      "such as 40 or 42"]


def test_one_named_gpu_for_every_process_is_refused():
    """train.device=cuda:0 under torchrun put every process on GPU 0 (device_for maps only
    cuda and auto to each process's own), which NCCL refuses in an error of its own."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.checks import check_distributed

    config = RunConfig(recipe="jrd", method=None)
    config.train.device = "cuda:1"
    with pytest.raises(KdmlError, match=r"^train\.device=cuda:1 puts all 2 processes of this "
                                        r"machine on one GPU; under torchrun give "
                                        r"train\.device=cuda"):
        check_distributed(config, World(rank=0, size=2), torch.device("cpu"))
    check_distributed(config, World(rank=0, size=1), torch.device("cpu"))  # one process: its GPU


def test_one_process_per_machine_may_name_its_gpu(monkeypatch):
    """--nnodes 2 --nproc_per_node 1: each process alone on its machine, so cuda:0 is its own
    GPU; it had been refused as putting "all 2 processes on one GPU"."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.checks import check_distributed

    config = RunConfig(recipe="jrd", method=None)
    config.train.device = "cuda:0"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    check_distributed(config, World(rank=1, size=2), torch.device("cpu"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(KdmlError, match="puts all 2 processes of this machine on one GPU"):
        check_distributed(config, World(rank=1, size=4), torch.device("cpu"))


def test_a_recipe_fitted_in_closed_form_takes_any_batch_size_over_the_processes(tmp_path):
    """PCA draws no batches, and its default data.batch_size=80 had been refused over 3
    processes ("must split evenly"); each recipe's draws_batches says what its method does."""
    from kdml.data import prepare
    from kdml.distributed import World
    from kdml.training.checks import check_distributed
    from kdml.training.recipes import RECIPES, get_recipe
    from kdml.training.trainer import build_method

    config = config_of("pca", [])
    check_distributed(config, World(rank=0, size=3), torch.device("cpu"), draws_batches=False)
    with pytest.raises(KdmlError, match="must split evenly over the 3 processes"):
        check_distributed(config, World(rank=0, size=3), torch.device("cpu"))
    splits = {}
    pair = f"data.dataset=npz:{write_domains(tmp_path / 'domains.npz')}"
    for name in RECIPES:
        recipe = get_recipe(name)
        data = pair if "->" in config_of(name, []).data.dataset else "data.dataset=digits"
        config = config_of(name, ["model.embedding_size=8", data])
        if config.model.backbone.startswith(("torchvision:", "timm:")):  # not importable here
            config = config_of(name, ["model.embedding_size=8", data, "model.backbone=cnn",
                                      "model.small_input=false"])
        if config.data.dataset not in splits:
            splits[config.data.dataset] = prepare.prepare_data(config.data)
        method = build_method(config, splits[config.data.dataset], echo=lambda line: None)
        assert recipe.draws_batches == (not method.needs_fit), name


@pytest.mark.parametrize(("batch_size", "per_class", "size", "remedy"), [
    (15, 0, 2, "a multiple of 2, such as 14 or 16"),
    (15, 5, 2, "a multiple of 10 (the 2 processes and data.samples_per_class=5 both divide "
               "it), such as 10 or 20"),
    (5, 5, 2, "a multiple of 10 (the 2 processes and data.samples_per_class=5 both divide "
              "it), such as 10"),
    (3, 0, 2, "a multiple of 2 of at least 4, such as 4"),  # 2 would give 1 per process
    (1, 0, 3, "a multiple of 3 of at least 6, such as 6"),
    (10, 2, 4, "a multiple of 4, such as 8 or 12"),  # 4 processes split whole classes of 2
])
def test_a_new_run_s_batch_that_does_not_split_names_the_values_that_do(batch_size, per_class,
                                                                      size, remedy):
    """The refusal of a new run named no value to use (a resumed run's names a number of
    processes): it names the nearest global batches that split, of whole classes where
    data.samples_per_class is set, and each is taken."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.checks import check_distributed

    config = RunConfig(recipe="jrd", method=None)
    config.data.batch_size, config.data.samples_per_class = batch_size, per_class
    with pytest.raises(KdmlError, match=(
            rf"^data\.batch_size={batch_size} is the global batch and must split evenly over "
            rf"the {size} processes; set data\.batch_size to {re.escape(remedy)}$")):
        check_distributed(config, World(rank=0, size=size), torch.device("cpu"))
    for value in re.findall(r"\d+", remedy.split("such as")[1]):
        config.data.batch_size = int(value)
        assert int(value) % (per_class or 1) == 0
        check_distributed(config, World(rank=0, size=size), torch.device("cpu"))


@pytest.mark.parametrize("batch_size, size", [(2, 2), (3, 3), (6, 6)])
def test_a_global_batch_of_one_sample_per_process_is_refused(batch_size, size):
    """A single process needs a batch of 2; under torchrun one sample per process had passed
    the checks and stopped every process at the first step with BatchNorm's traceback
    ("Expected more than 1 value per channel when training")."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.checks import check_distributed

    config = RunConfig(recipe="jrd", method=None)
    config.data.batch_size = batch_size
    with pytest.raises(KdmlError, match=(
            rf"^data\.batch_size={batch_size} gives each of the {size} processes one sample; "
            rf"each needs at least 2, as a single process does: set data\.batch_size to "
            rf"{2 * size} or more$")):
        check_distributed(config, World(rank=0, size=size), torch.device("cpu"))
    config.data.batch_size = 2 * size
    check_distributed(config, World(rank=0, size=size), torch.device("cpu"))
    config.data.batch_size = 0  # the whole split: checked against its size where it is known
    check_distributed(config, World(rank=0, size=size), torch.device("cpu"))


@pytest.mark.parametrize(("batch_size", "size", "fitting"), [(40, 3, 2), (2, 2, 1), (6, 4, 3),
                                                           (6, 6, 3)])
def test_a_resumed_batch_the_processes_cannot_share_is_mended_by_their_number(
        batch_size, size, fitting):
    """A run resumed under a torchrun whose processes cannot share its global batch had been
    told to set data.batch_size, an edit --resume then refuses ("put the setting back"): it
    keeps the batch it trained with, so the refusal names a number of processes that works.
    A new run is still told to change data.batch_size."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.checks import check_distributed

    config = RunConfig(recipe="jrd", method=None)
    config.data.batch_size = batch_size
    with pytest.raises(KdmlError) as refused:
        check_distributed(config, World(rank=0, size=size), torch.device("cpu"), resumed=True)
    said = str(refused.value)
    assert "set data.batch_size" not in said
    assert said.endswith(f"a resumed run keeps the global batch it trained with, so resume it "
                         f"in a number of processes that splits {batch_size} samples into "
                         f"equal shares of 2 or more, such as {fitting} (torchrun's "
                         "--nproc_per_node times --nnodes)"), said
    check_distributed(config, World(rank=0, size=fitting), torch.device("cpu"), resumed=True)
    with pytest.raises(KdmlError, match="data.batch_size"):  # a new run may change it
        check_distributed(config, World(rank=0, size=size), torch.device("cpu"))


def test_a_resumed_whole_split_batch_the_processes_cannot_share_is_mended_by_their_number():
    """data.batch_size=0 (the whole training split, 901 digits) over 2 processes: a new run is
    told to set data.batch_size, a resumed one (which keeps it) to resume in 1 process."""
    from kdml.data import prepare
    from kdml.distributed import World
    from kdml.training.batches import TrainingBatches

    config = config_of("jrd", ["data.dataset=digits", "data.batch_size=0"])
    splits = prepare.prepare_data(config.data)
    world = World(rank=0, size=2)
    with pytest.raises(KdmlError, match=r"set data\.batch_size to a multiple of 2$"):
        TrainingBatches(config, splits, False, torch.device("cpu"), world)
    with pytest.raises(KdmlError, match=r"\(901 samples\) one global batch, which does not "
                                        r"split evenly over the 2 processes; a resumed run keeps "
                                        r"the global batch .* splits 901 samples .* such as 1 "):
        TrainingBatches(config, splits, False, torch.device("cpu"), world, resumed=True)


def test_a_torchrun_run_resumed_in_processes_that_cannot_share_its_batch(torchrun_run,
                                                                        tmp_path):
    """The 2-process run of a global batch of 40, resumed in 3 processes: refused in one line
    that names a number of processes to resume it in, not an edit of data.batch_size."""
    folder, _ = torchrun_run
    run = tmp_path / "run"
    shutil.copytree(folder / "run", run)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [*TORCHRUN, "train", "--resume", str(run), "--no-progress"]
    command[command.index("--nproc_per_node=2")] = "--nproc_per_node=3"
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("kdml: error")]
    assert errors == ["kdml: error: data.batch_size=40 is the global batch and must split "
                      "evenly over the 3 processes; a resumed run keeps the global batch it "
                      "trained with, so resume it in a number of processes that splits 40 "
                      "samples into equal shares of 2 or more, such as 2 (torchrun's "
                      "--nproc_per_node times --nnodes)"], result.stderr[-2000:]


def test_data_only_one_rank_cannot_read_is_named_by_rank_0(tmp_path):
    """A rank whose machine lacks the data stopped by itself in silence (only rank 0 says
    the errors all ranks meet), and torchrun stopped rank 0, waiting in DistributedDataParallel's
    first collective, before it said anything: no process said what was wrong."""
    overrides = [*COMMON, "data.dataset=digits", "data.batch_size=40"]
    run_ranks(2, build_failing_on_rank_1, "amsoftmax", overrides, str(tmp_path),
              tmp_path=tmp_path)
    assert (tmp_path / "rank-0.txt").read_text() == ("KdmlError: rank 1: folder:imgs: no such "
                                                      "folder")
    assert (tmp_path / "rank-1.txt").read_text().startswith("QuietExit: ")


@pytest.mark.parametrize(("copy", "difference"), [
    # a stale copy with more samples: the ranks' epochs had different steps, and gloo stopped
    # them in mismatched collectives ("Received data size doesn't match expected size")
    (dict(source=100), "rank 1's train part has 100 samples of 4 classes, rank 0's 80 "
                       "samples of 4 classes"),
    # as many samples, other values: it had trained and scored a mixture of both, silently
    (dict(seed=1), "rank 1's train part has the same 80 samples of 4 classes as rank 0's, but "
                   "its samples or labels differ"),
])
def test_ranks_that_read_different_data_are_refused_by_rank_0(tmp_path, copy, difference):
    first = write_domains(tmp_path / "first.npz")
    other = write_domains(tmp_path / "other.npz", seed=copy.get("seed", 0))
    if "source" in copy:  # 20 source samples more, the target as it was
        arrays = dict(np.load(other))
        np.savez(other, **{key: np.concatenate([value[:80], value[:20], value[80:]])
                           for key, value in arrays.items()})
    overrides = [*COMMON, "data.batch_size=16"]
    run_ranks(2, build_on_own_settings, "ddml-logistic", overrides,
              [[f"data.dataset=npz:{first}"], [f"data.dataset=npz:{other}"]], str(tmp_path),
              tmp_path=tmp_path)
    assert (tmp_path / "rank-0.txt").read_text() == (
        f"KdmlError: the processes read different data for npz:{first}: {difference}; every "
        "process must read the same data (on several machines, the same copy: check data.root, "
        "$KDML_DATA_ROOT and the dataset's files on each)")
    assert (tmp_path / "rank-1.txt").read_text().startswith("QuietExit: ")


def test_ranks_that_read_the_same_data_from_other_folders_agree(tmp_path):
    """Each machine may keep its copy elsewhere: the fingerprint leaves the folder out."""
    first = write_domains(tmp_path / "first.npz")
    (tmp_path / "elsewhere").mkdir()
    other = shutil.copy(first, tmp_path / "elsewhere" / "copy.npz")
    run_ranks(2, build_on_own_settings, "ddml-logistic", [*COMMON, "data.batch_size=16"],
              [[f"data.dataset=npz:{first}", "eval.embed_batch_size=64"],
               [f"data.dataset=npz:{other}"]], str(tmp_path),
              tmp_path=tmp_path)
    assert (tmp_path / "rank-0.txt").read_text() == "no error"
    assert (tmp_path / "rank-1.txt").read_text() == "no error"


def test_ranks_that_train_different_settings_are_refused_by_rank_0(tmp_path):
    """Another config file on one machine: each rank stepped its own optimiser at its own
    rate, and the ranks' models drifted apart without a word (rank 0's was saved; every
    rank's embedded its share of the test set)."""
    run_ranks(2, build_on_own_settings, "amsoftmax",
              [*COMMON, "data.dataset=digits", "data.batch_size=40"], [[], ["optim.lr=0.01"]],
              str(tmp_path), tmp_path=tmp_path)
    assert (tmp_path / "rank-0.txt").read_text() == (
        "KdmlError: the processes train different settings: optim.lr is 0.05 on rank 0 and "
        "0.01 on rank 1 (another config file or command); start every process with the same "
        "command and config")
    assert (tmp_path / "rank-1.txt").read_text().startswith("QuietExit: ")


def test_a_model_that_diverged_is_a_non_finite_loss_on_every_rank(tmp_path):
    """Rank 0 alone had found the overflowing test embeddings, and the other ranks got a
    QuietExit: a torchrun grid's rank 0 reported the cell diverged and went on to the next,
    whose first collective failed, since the others had stopped."""
    run_ranks(2, score_diverged, "amsoftmax",
              [*COMMON, "data.dataset=digits", "data.batch_size=40"], str(tmp_path),
              tmp_path=tmp_path)
    assert [(tmp_path / f"rank-{rank}.txt").read_text() for rank in (0, 1)] == [
        "NonFiniteLoss", "NonFiniteLoss"]


def test_errors_before_the_process_group_are_said_by_rank_0_alone(monkeypatch, capsys):
    """Refused before joining (an unknown dataset), every rank had printed the same line,
    since each took itself for rank 0 until the group existed: now torchrun's RANK says."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["train", "jrd", "--dataset", "nosuch", "--no-progress"]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["train", "jrd", "--dataset", "nosuch", "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("kdml: error: unknown dataset 'nosuch'")


def test_a_machine_with_fewer_gpus_than_processes_is_named_by_the_processes_without_one(
        monkeypatch, capsys):
    """With one GPU and two processes, rank 1 had been told "train.device=cuda:1 but this
    machine has 1 CUDA device ...; use cpu or auto", though it had been given auto."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cli.main(["train", "jrd", "--dataset", "digits", "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: rank 1: torchrun started 2 processes on this machine, which has 1 "
        "visible GPU, and each process trains on its own GPU: start at most 1 per machine "
        "(torchrun's nproc_per_node), or give train.device=cpu\n")


def test_sharded_kernels_are_refused_for_a_recipe_without_jrs():
    """Under torchrun, amsoftmax and the other recipes without JRS had taken
    train.sharded_kernels=true and ignored it, gathering every kernel matrix whole."""
    from kdml.data import prepare
    from kdml.training.checks import check_method_on_splits
    from kdml.training.trainer import build_method

    for recipe, refused in (("amsoftmax", True), ("mtriplet", True), ("jrd", False)):
        config = config_of(recipe, ["data.dataset=digits", "train.sharded_kernels=true",
                                    "model.embedding_size=8"])
        splits = prepare.prepare_data(config.data)
        method = build_method(config, splits, echo=lambda line: None)
        if not refused:
            check_method_on_splits(config, splits, method)
            continue
        with pytest.raises(KdmlError, match=(
                rf"^train\.sharded_kernels splits JRS's kernel rows, and {recipe} has no JRS "
                r"regularizer: drop it")):
            check_method_on_splits(config, splits, method)


def test_skipping_unreadable_images_is_refused_under_torchrun_alone():
    """data.on_bad_image=skip would leave the processes' batches unequal: refused over
    several processes, taken by one."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.checks import check_distributed

    config = RunConfig(recipe="jrd", method=None)
    config.data.on_bad_image = "skip"
    config.data.batch_size = 8
    with pytest.raises(KdmlError, match=r"^data\.on_bad_image=skip would leave the processes' "
                                        r"batches unequal; use error under torchrun$"):
        check_distributed(config, World(rank=0, size=2), torch.device("cpu"))
    check_distributed(config, World(rank=0, size=1), torch.device("cpu"))


def test_sharded_kernels_are_taken_for_jrd_wrapped_in_a_domain_term(tmp_path):
    """jrd with domain.beta on a domain pair is a DomainAdaptedMethod around a JRD method,
    whose JRS regularizer the sharded kernels split: taken, not refused as without JRS."""
    from kdml.data import prepare
    from kdml.training.checks import check_method_on_splits
    from kdml.training.domain_adapted import DomainAdaptedMethod
    from kdml.training.trainer import build_method

    pair = f"data.dataset=npz:{write_domains(tmp_path / 'domains.npz')}"
    config = config_of("jrd", [pair, "domain.beta=0.5", "train.sharded_kernels=true",
                               "model.embedding_size=8"])
    splits = prepare.prepare_data(config.data)
    method = build_method(config, splits, echo=lambda line: None)
    assert isinstance(method, DomainAdaptedMethod)
    check_method_on_splits(config, splits, method)


def test_an_error_one_rank_meets_alone_is_said_by_that_rank(monkeypatch, capsys):
    """An unreadable image in rank 1's share of a batch stopped a torchrun job with rank 0's
    "a collective operation failed ... its output says why", and rank 1's output said
    nothing: it left every error to rank 0, which says those all ranks meet alike."""
    from kdml import distributed
    from kdml.errors import LocalError

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(rank=1, size=2))
    for error, said in ((KdmlError("every rank meets this"), ""),
                        (LocalError("cannot decode image a/b.jpg: truncated"),
                         "kdml: error: rank 1: cannot decode image a/b.jpg: truncated\n")):
        def command(args, error=error):
            raise error

        monkeypatch.setitem(cli._COMMANDS, "recipes", command)
        assert cli.main(["recipes"]) == 2
        assert capsys.readouterr().err == said


def _rank_1_waits_alone():
    if dist.get_rank() == 1:  # a broadcast rank 0 never makes
        dist.broadcast_object_list([None], src=0)
    else:
        time.sleep(600)


def test_ranks_that_wait_on_each_other_fail_the_test_in_its_limit(tmp_path, monkeypatch):
    """A rank left waiting on a collective the others never make had outlived gloo's 2-minute
    timeout and held the test (found by the mutation audit: a dropped broadcast)."""
    import distributed_harness

    monkeypatch.setattr(distributed_harness, "RANKS_TIMEOUT_S", 3)
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"^_rank_1_waits_alone: the 2 ranks had not "
                                             r"finished after 3 s"):
        run_ranks(2, _rank_1_waits_alone, tmp_path=tmp_path)
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(("overflowed_rank", "outcome"), [
    (1, "no error [1.0, 1.0]"),  # rank 0's statistics, which the checkpoint keeps: finite
    (0, "NonFiniteLoss [inf, inf]"),  # the checkpoint's overflowed: every rank stops
])
def test_the_epoch_end_weight_check_decides_alike_on_every_rank(tmp_path, overflowed_rank,
                                                                outcome):
    """Each rank had checked its own state_dict, whose BatchNorm statistics are of its own
    last share: one rank's alone overflowing raised there alone, and the others went on to
    their next collective. The buffers checked are now rank 0's on every rank (broadcast,
    as scoring and the next forward do), so the ranks stop together or not at all."""
    run_ranks(2, epoch_weights_with_rank_statistics, overflowed_rank, str(tmp_path),
              tmp_path=tmp_path)
    assert [(tmp_path / f"rank-{rank}.txt").read_text() for rank in (0, 1)] == [outcome] * 2


def test_a_loss_non_finite_on_one_rank_stops_every_rank_at_its_step(tmp_path):
    """The per-step non-finite check had read each rank's own flag: a NaN in one rank's loss
    alone stopped that rank by itself, silently (only rank 0 prints an error every rank
    meets), and rank 0, waiting in DistributedDataParallel's gradient all-reduce, reported only
    "a collective operation failed". The ranks now agree on the earliest non-finite step at
    each check, so every rank stops there with the same one-line NonFiniteLoss."""
    run_ranks(2, loss_non_finite_on_one_rank, "amsoftmax",
              [*COMMON, "data.dataset=digits", "data.batch_size=40"], 1, 1, str(tmp_path),
              tmp_path=tmp_path)
    said = ("KdmlError: training stopped: the 'loss' term became NaN or infinite at "
            "epoch 1, step 2; no epoch finished, so the run folder holds no checkpoint. ")
    outcomes = [(tmp_path / f"rank-{rank}.txt").read_text() for rank in (0, 1)]
    assert outcomes[0].startswith(said), outcomes
    assert outcomes[1] == outcomes[0]


@pytest.mark.parametrize(("world", "reads"), [(1, [1]), (2, [3])])
def test_the_non_finite_watch_is_read_every_cpu_step_in_one_process_alone(tmp_path, world,
                                                                           reads):
    """Under torchrun each read of the non-finite watch is also a collective (the ranks agree
    on the first bad step): read at every CPU step, as in one process where a read costs
    nothing, it cost 1.5 to 4 ms a step on 2 gloo processes, a tenth of a small model's epoch.
    It is read every NONFINITE_CHECK_EVERY steps there, as on a GPU, and at the epoch's end,
    still naming the first bad step."""
    got = run_ranks(world, non_finite_reads, "amsoftmax",
                    [*COMMON, "data.dataset=digits", "data.batch_size=40"], 0, tmp_path=tmp_path)
    assert got["reads"] == reads
    assert got["said"].startswith("training stopped: the 'loss' term became NaN or infinite at "
                                  "epoch 1, step 1; no epoch finished")
