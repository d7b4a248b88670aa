"""A user's own data, as a fuzzing session found it mishandled: feature files (``npz:``) whose
labelled target cannot be scored or is of one class."""

from __future__ import annotations

import numpy as np


def _features(path, target_labels):
    """Six source samples of classes 0-2 and one target sample per entry of
    ``target_labels`` (-1 = unlabelled)."""
    rng = np.random.default_rng(0)
    source_labels = [0, 0, 1, 1, 2, 2]
    labels = np.array(source_labels + list(target_labels))
    features = rng.standard_normal((len(labels), 4)).astype(np.float32)
    domain = np.array(["source"] * len(source_labels) + ["target"] * len(target_labels))
    np.savez(path, X=features, y=labels, domain=domain)
    return path


def _train_refused_before_training(tmp_path, capsys, monkeypatch, *args) -> str:
    """``kdml train *args`` refused in one line before any step (a step fails the test)."""
    from kdml import cli
    from kdml.training import trainer

    def never(*_, **__):
        raise AssertionError("trained before the test set was checked")

    monkeypatch.setattr(trainer, "train_one_epoch", never)
    out = tmp_path / "run"
    assert cli.main(["train", *map(str, args), "--out", str(out), "--no-progress",
                     "train.epochs=1", "train.device=cpu", "eval.ks=[1]",
                     "data.batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: ") and err.count("\n") == 1, err
    return err


def test_a_feature_file_whose_labelled_target_is_one_class_is_warned_about(caplog):
    """Every labelled target sample of one class: the target retrieval metrics are all
    trivially 1 (a run had printed 1.0000 for each without a word), while source_nn_accuracy
    still measures the transfer, so it trains, with a warning saying so."""
    import logging

    import torch

    from kdml.data.dataset import ArrayDataset
    from kdml.data.prepare import domain_splits
    from kdml.training.checks import warn_about_splits

    source = ArrayDataset("src", "s", torch.rand(6, 4), torch.arange(6) % 3)
    target = ArrayDataset("tgt", "t", torch.rand(5, 4), torch.tensor([0, 0, 0, -1, -1]))
    with caplog.at_level("WARNING", logger="kdml.test"):
        warn_about_splits(domain_splits(source, target), logging.getLogger("kdml.test"))
    assert [record.getMessage() for record in caplog.records] == [
        "every labelled target sample of tgt has the same class, so the target retrieval "
        "metrics (Recall@K, MAP@R, R-Precision, NMI) are trivially 1; only source_nn_accuracy "
        "measures the model: label target samples of two classes or more"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="kdml.test"):  # two classes: no warning
        warn_about_splits(domain_splits(source, ArrayDataset(
            "tgt", "t", torch.rand(5, 4), torch.tensor([0, 0, 1, -1, -1]))),
            logging.getLogger("kdml.test"))
    assert caplog.records == []


def test_a_feature_file_without_a_scorable_target_query_is_refused_before_training(
        tmp_path, capsys, monkeypatch):
    """Labelled target samples that are each the only one of their class: no query has
    anything to retrieve. The check that refuses this before training for other datasets
    (check_test_classes) is skipped for domain pairs, so the run trained its first epoch,
    then stopped ("no query has another sample of its class in the reference set") and
    dropped it."""
    path = _features(tmp_path / "singletons.npz", [0, 1, 2, -1])
    err = _train_refused_before_training(tmp_path, capsys, monkeypatch, "jrd", "--dataset",
                                         f"npz:{path}")
    assert err.endswith("has another of its class to retrieve, so Recall@K is undefined; label "
                        "at least two target samples of a class (-1 marks the unlabelled "
                        "ones)\n")
