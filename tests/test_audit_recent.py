"""Mutation-audit tests for recent code: torchrun's variables (kdml.launch), the shared input
checks (kdml.checks), the CLI's out-of-memory lines, and the input PCA a checkpoint keeps."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from kdml import cli, kernels, launch
from kdml.checks import (
    as_number,
    assert_message,
    check_class_range,
    check_feature_matrix,
    check_float_inputs,
    check_integer_labels,
    check_label_device,
    check_seed,
)
from kdml.data.domains import SourcePCA
from kdml.data.sample_spec import SampleSpec
from kdml.errors import KdmlError, LocalError, UnreadableCheckpoint, why_missing
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.regularizers.manifold import ManifoldMMD
from kdml.training.loading import stored_pca

TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")


@pytest.fixture
def torchrun_env(monkeypatch):
    """A two-process job's variables, all set right (this process: rank 1)."""
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    return monkeypatch


# ------------------------------------------------------------------------- kdml.launch


@pytest.mark.parametrize(("name", "value"), [("RANK", "2"), ("RANK", "-1"), ("LOCAL_RANK", "x"),
                                             ("LOCAL_RANK", "-1")])
def test_check_rendezvous_refuses_a_bad_rank_before_torch_joins(torchrun_env, name, value):
    """A RANK outside the world or a LOCAL_RANK that is no count is refused by the check
    itself: past it, torch's init_process_group would wait for peers that never come."""
    torchrun_env.setenv(name, value)
    with pytest.raises(LocalError, match=f"^the environment variable {name}={value!r} "):
        launch.check_rendezvous()


@pytest.mark.parametrize("port", ["abc", "0", "65536", "-1"])
def test_check_rendezvous_refuses_a_master_port_that_is_no_port(torchrun_env, port):
    """torch had stopped with its own ValueError ("invalid literal for int()") or a port out of
    range after the process started to join."""
    torchrun_env.setenv("MASTER_PORT", port)
    with pytest.raises(LocalError, match=rf"^the environment variable MASTER_PORT='{port}' is "
                                         r"not a whole number from 1 to 65535: "):
        launch.check_rendezvous()


def test_check_rendezvous_passes_torchruns_own_values(torchrun_env):
    assert launch.check_rendezvous() is None


def test_two_missing_rendezvous_variables_are(torchrun_env):
    torchrun_env.delenv("MASTER_ADDR")
    torchrun_env.delenv("MASTER_PORT")
    with pytest.raises(KdmlError, match="but MASTER_ADDR, MASTER_PORT are not set: "):
        launch.check_rendezvous()


def test_an_empty_rank_is_no_count(torchrun_env):
    torchrun_env.setenv("RANK", "")
    with pytest.raises(LocalError, match="^the environment variable RANK='' is not a whole "
                                         "number from 0 to 1"):
        launch.launch_rank()


# ------------------------------------------------------------------------- kdml.checks


@pytest.mark.parametrize("seed", [0, 7, np.int64(0), np.uint32(5), np.int8(3)])
def test_check_seed_takes_python_and_numpy_integers_from_0(seed):
    assert check_seed(seed) is None


@pytest.mark.parametrize("seed", [-1, np.int64(-1), True, False, np.bool_(True), 1.0, "1",
                                  None])
def test_check_seed_refuses_anything_else_in_one_line(seed):
    with pytest.raises(KdmlError, match=r"^the seed must be an integer of at least 0, got "):
        check_seed(seed, "the seed")


@pytest.mark.parametrize("shape", [(4, 5, 5), (4, 5, 1), (5,), (4, 6)])
def test_check_feature_matrix_refuses_anything_but_b_by_width(shape):
    with pytest.raises(KdmlError, match=rf"^Head expects features \[B, 5\], got "
                                        rf"{re.escape(str(shape))}$"):
        check_feature_matrix("Head", torch.zeros(shape), 5)
    assert check_feature_matrix("Head", torch.zeros(4, 5), 5) is None
    assert check_feature_matrix("Head", torch.zeros(0, 5), 5) is None


def test_check_float_inputs_looks_at_every_tensor():
    with pytest.raises(KdmlError, match="^Loss expects floating point embeddings, got "
                                        r"torch.int64; convert with \.float\(\)$"):
        check_float_inputs("Loss", [torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long)])


def test_an_assert_message_of_exactly_the_limit_is_kept_whole():
    assert assert_message("a" * 250) == "a" * 250
    assert assert_message("a" * 251) == "a" * 247 + "..."


def test_complex_labels_are_refused():
    with pytest.raises(KdmlError, match="labels must be integers, got dtype torch.complex64"):
        check_integer_labels("Loss", torch.zeros(3, dtype=torch.complex64))


def test_an_empty_batch_of_labels_is_in_range():
    assert check_class_range("Loss", torch.empty(0, dtype=torch.long), 3, "one a column") is None


def test_as_number_reads_a_0d_array_or_tensor_as_a_float():
    for value in (np.array(2.5), torch.tensor(2.5)):
        number = as_number(value, "x")
        assert type(number) is float and number == 2.5
    row = np.array([2.5])
    assert as_number(row, "x") is row


@pytest.mark.parametrize("make", [
    lambda: kernels.GaussianMixtureKernel(bandwidth=torch.nn.Parameter(torch.tensor(2.0))),
    lambda: kernels.LaplaceKernel(bandwidth=torch.nn.Parameter(torch.tensor(2.0))),
    lambda: kernels.PolynomialKernel(bias=torch.tensor(1.0, requires_grad=True)),
    lambda: MarginalFisherLoss(alpha=torch.nn.Parameter(torch.tensor(0.1))),
    lambda: ManifoldMMD(2, 3, eps=torch.nn.Parameter(torch.tensor(1e-3))),
], ids=["gaussian-bandwidth", "laplace-bandwidth", "polynomial-bias", "fisher-alpha",
        "manifold-eps"])
def test_a_setting_read_once_refuses_a_tensor_to_be_learned(make):
    """A setting kdml reads once, as a number (as_number), had taken an nn.Parameter with
    only torch's warning ("Converting a tensor with requires_grad=True to a scalar"): the
    user's optimiser then trained nothing there. Detached, the same tensor is taken."""
    with pytest.raises(KdmlError, match=r"is a tensor that requires grad, but kdml reads it "
                                        r"once, as a number, so it would not be learned"):
        make()
    assert kernels.LaplaceKernel(bandwidth=torch.nn.Parameter(torch.tensor(2.0)).detach()
                                 ).bandwidth == 2.0


def test_label_device_with_no_tensors_checks_nothing():
    assert check_label_device("Loss", torch.zeros(3, dtype=torch.long), []) is None


def test_why_missing_says_which():
    here = Path(__file__)
    assert why_missing(here.parent, "file") == "is not a file"
    assert why_missing(here.parent / "no-such-thing", "file") == "does not exist"


# ------------------------------------------------------------------ kdml.cli, out of memory


def _fails(error: BaseException):
    def command(args):
        raise error
    return command


def _other_rank(monkeypatch):
    monkeypatch.setattr(cli, "_is_main_process", lambda: False)
    monkeypatch.setattr(cli, "_rank", lambda: 3)


def test_out_of_memory_on_another_rank_names_it(monkeypatch, capsys):
    _other_rank(monkeypatch)
    monkeypatch.setitem(cli._COMMANDS, "recipes", _fails(MemoryError()))
    assert cli.main(["recipes"]) == 1
    assert capsys.readouterr().err == ("kdml: error: rank 3: out of memory; free memory or use "
                                       "a device with more, and run it again\n")


def _killed_worker() -> RuntimeError:
    """torch's report of a loader worker killed by SIGKILL, raised over the signal's error."""
    try:
        try:
            raise RuntimeError("DataLoader worker (pid 123) is killed by signal: Killed. ")
        except RuntimeError as killed:
            raise RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly") from killed
    except RuntimeError as error:
        return error


def test_a_killed_worker_on_another_rank_names_it(monkeypatch, capsys):
    _other_rank(monkeypatch)
    monkeypatch.setitem(cli._COMMANDS, "recipes", _fails(_killed_worker()))
    assert cli.main(["recipes"]) == 1
    assert capsys.readouterr().err.startswith("kdml: error: rank 3: a data loader worker was "
                                              "killed (SIGKILL)")


def test_a_killed_worker_in_reproduce_says_it_keeps_its_finished_runs(monkeypatch, capsys):
    monkeypatch.setitem(cli._COMMANDS, "reproduce", _fails(_killed_worker()))
    assert cli.main(["reproduce", "dtml"]) == 1
    assert capsys.readouterr().err.endswith(
        "lack of memory; free memory or use a device with more, and run it again (it keeps its "
        "finished runs and continues)\n")


@pytest.mark.parametrize(("error", "size"), [
    (RuntimeError("can't allocate memory: you tried to allocate 1073741824 Bytes"), "1.0 GiB"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00MiB"), "20.00 MiB"),
], ids=["bytes", "no space"])
def test_the_allocation_size_is_read_in_torchs_other_spellings(monkeypatch, capsys, error,
                                                               size):
    monkeypatch.setitem(cli._COMMANDS, "recipes", _fails(error))
    assert cli.main(["recipes"]) == 1
    assert capsys.readouterr().err.startswith(f"kdml: error: out of memory (tried to allocate "
                                              f"{size}); ")


def _numpy_memory_error_in_a_worker() -> RuntimeError:
    """torch's own error for NumPy's MemoryError in a loader worker (8 PiB)."""
    from torch.utils.data import DataLoader, Dataset

    class TooLarge(Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int):
            return np.empty(2**50)

    try:
        next(iter(DataLoader(TooLarge(), num_workers=1)))
    except RuntimeError as error:
        return error
    pytest.skip("this machine allocated 8 PiB")  # an overcommitting kernel might


def test_numpy_out_of_memory_in_a_loader_worker_is_the_one_line(monkeypatch, capsys):
    """torch raises a worker's NumPy MemoryError again as a RuntimeError ("Caught MemoryError
    in DataLoader worker process 0"), which had come through as a traceback."""
    monkeypatch.setitem(cli._COMMANDS, "recipes", _fails(_numpy_memory_error_in_a_worker()))
    assert cli.main(["recipes"]) == 1
    assert capsys.readouterr().err == ("kdml: error: out of memory (tried to allocate 8.00 PiB);"
                                       " free memory or use a device with more, and run it "
                                       "again\n")


def test_another_runtime_error_naming_an_allocation_keeps_its_traceback(monkeypatch):
    error = RuntimeError("expected the storage allocated on cuda:0, got cpu")
    monkeypatch.setitem(cli._COMMANDS, "recipes", _fails(error))
    with pytest.raises(RuntimeError, match="storage allocated"):
        cli.main(["recipes"])


# ------------------------------------------------------------- a checkpoint's input PCA


@pytest.mark.parametrize("state", [
    {"mean": torch.zeros(0, dtype=torch.float64),
     "components": torch.zeros(2, 0, dtype=torch.float64)},  # no features
    {"mean": torch.zeros(3, 3, dtype=torch.float64),
     "components": torch.zeros(2, 3, dtype=torch.float64)},  # a mean that is a matrix
    torch.zeros(2, 3, dtype=torch.float64),  # a tensor, not the dict of two
    {"mean": torch.zeros(3), "components": torch.zeros(2, 3, dtype=torch.float64)},
    {"mean": torch.zeros(3, dtype=torch.float64), "components": torch.zeros(2, 3)},
    {"mean": torch.zeros(3, dtype=torch.float64),
     "components": torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 0.0]],
                                dtype=torch.float64)},
])
def test_more_damaged_pca_states_are_refused_in_one_line(state):
    with pytest.raises(UnreadableCheckpoint, match="^checkpoint last.pt is damaged: its input "
                                                   "PCA is not the finite float64"):
        SourcePCA.from_state(state, "last.pt")


def _spec(shape: tuple[int, ...]) -> SampleSpec:
    return SampleSpec(sample_shape=shape, is_file_backed=False, holds_pixels=False,
                      float_dtype="float32", default_backbone="mlp", train_classes=2)


def _pca_state(dim: int, features: int) -> dict:
    return {"input_pca": {"mean": torch.zeros(features, dtype=torch.float64),
                          "components": torch.eye(dim, features, dtype=torch.float64)}}


def test_stored_pca_is_checked_against_the_run():
    checkpoint = Path("run/checkpoints/last.pt")
    pca = stored_pca(_pca_state(3, 5), checkpoint, 3, _spec((3,)))
    assert (pca.dim, pca.feature_size) == (3, 5)
    for pca_dim, shape in ((2, (3,)), (3, (4,)), (3, (1, 3))):
        with pytest.raises(UnreadableCheckpoint, match=(
                f"its input PCA has 3 components, but the run's data.pca_dim is {pca_dim} and "
                rf"its model takes samples of shape {re.escape(str(shape))}; delete it")):
            stored_pca(_pca_state(3, 5), checkpoint, pca_dim, _spec(shape))
