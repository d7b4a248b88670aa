"""The cross-domain workflow (DTML family, domain pairs, ``npz:`` feature files), as a fuzzing
session found it mishandled: a misleading refusal of ``domain.beta`` on the ``pca`` recipe,
DTML weights given as tensors refused with a message that contradicts itself, and a DSTML
run whose network has no hidden layer silently training plain DTML."""

from __future__ import annotations

import numpy as np
import torch

from kdml.losses.dtml_objective import DTMLObjective
from kdml.models.dtml import DTMLNetwork


def _features(path):
    """Source: 8 samples of each of classes 0-2; target: 6 samples, two of each class."""
    rng = np.random.default_rng(0)
    labels = np.array([c for c in range(3) for _ in range(8)] + [0, 0, 1, 1, 2, 2])
    features = rng.standard_normal((len(labels), 4)).astype(np.float32)
    domain = np.array(["source"] * 24 + ["target"] * 6)
    np.savez(path, X=features, y=labels, domain=domain)
    return path


def _train(tmp_path, capsys, *args) -> tuple[int, str]:
    from kdml import cli

    code = cli.main(["train", *map(str, args), "--out", str(tmp_path / "run"), "--no-progress",
                     "train.epochs=1", "train.device=cpu", "eval.ks=[1]", "data.batch_size=6",
                     "data.samples_per_class=2"])
    return code, capsys.readouterr().err


def test_domain_beta_on_the_pca_recipe_is_refused_naming_domain_beta(tmp_path, capsys):
    """``kdml train pca ... domain.beta=1`` said "the pca model has no parameters to train and
    no closed-form fit": PCA has a closed-form fit; DomainAdaptedMethod hid its needs_fit.
    The refusal should name the setting that does not apply."""
    path = _features(tmp_path / "f.npz")
    code, err = _train(tmp_path, capsys, "pca", "--dataset", f"npz:{path}", "domain.beta=1")
    assert code == 2
    assert err.startswith("kdml: error: ") and err.count("\n") == 1, err
    assert "domain.beta" in err and "closed-form" not in err, err


def test_dtml_objective_takes_its_weights_as_tensors_as_it_takes_hidden_weight():
    """hidden_weight=torch.tensor(1.0) and an array per layer are taken, but beta, alpha and
    gamma as 0-d tensors, and hidden_weight as a 1-d tensor, were refused with "must be a
    finite number >= 0, got tensor(1.)": a message that contradicts itself."""
    torch.manual_seed(0)
    net = DTMLNetwork([4, 4, 3, 2])
    source, target = torch.randn(12, 4), torch.randn(5, 4)
    labels = torch.arange(3).repeat(4)

    def total(**settings) -> float:
        objective = DTMLObjective(k1=1, k2=2, **settings)
        return float(objective(net(source), labels, net(target), net).total.detach())

    assert total(beta=torch.tensor(1.0), alpha=torch.tensor(0.5),
                 gamma=torch.tensor(0.1)) == total(beta=1.0, alpha=0.5, gamma=0.1)
    assert total(hidden_weight=torch.tensor([1.0, 2.0])) == total(
        hidden_weight=np.array([1.0, 2.0]))


def test_dstml_without_a_hidden_layer_says_that_omega_is_unused(tmp_path, capsys):
    """dstml with method.layer_sizes=[2] has no hidden layer: its omega hinge has nowhere to
    go, and the run is bit for bit a dtml run, silently (model.embedding_size, likewise
    unused by the family, is warned of)."""
    path = _features(tmp_path / "f.npz")
    code, err = _train(tmp_path, capsys, "dstml", "--dataset", f"npz:{path}",
                       "method.layer_sizes=[2]", "method.k1=1", "method.k2=2")
    assert code == 0, err
    assert ("kdml: warning: method.omega=1 weighs the hidden layers' criteria, and "
            "method.layer_sizes=[2] leaves the network no hidden layer: dstml trains as dtml") \
        in err, err


def test_a_source_class_smaller_than_k1_is_warned_of_though_the_sampler_repeats_it(
        tmp_path, capsys):
    """A source class of 2 samples with data.samples_per_class=4: the class-balanced sampler
    fills its 4 places with replacement, so each copy of a sample is the others' nearest
    same-class neighbour at distance 0 (P of Eq. 4 links a sample to itself), and the
    MarginalFisherLoss warning about classes with fewer than k1 + 1 members stays silent:
    the batch appears to hold 4 of the class. It is warned of, for every recipe (a triplet's
    positive is such a copy too), and kept in train.log."""
    rng = np.random.default_rng(0)
    labels = np.array([0] * 8 + [1] * 8 + [2] * 2 + [0, 0, 1, 1, 2, 2])
    features = rng.standard_normal((len(labels), 4)).astype(np.float32)
    domain = np.array(["source"] * 18 + ["target"] * 6)
    np.savez(tmp_path / "f.npz", X=features, y=labels, domain=domain)
    from kdml import cli

    code = cli.main(["train", "dtml", "--dataset", f"npz:{tmp_path / 'f.npz'}", "--out",
                     str(tmp_path / "run"), "--no-progress", "train.epochs=1",
                     "train.device=cpu", "eval.ks=[1]", "data.batch_size=12",
                     "data.samples_per_class=4", "method.k1=3", "method.k2=2"])
    err = capsys.readouterr().err
    assert code == 0, err
    line = ("kdml: warning: 1 training class has fewer samples than data.samples_per_class=4 "
            "(class 2 has 2): its batches repeat samples")
    assert line in err, err
    assert line.removeprefix("kdml: warning: ") in (tmp_path / "run" / "train.log").read_text()
