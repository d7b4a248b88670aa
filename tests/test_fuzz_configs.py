"""Shipped configs, on-disk formats and the config grammar, as a fuzzing session found them
mishandled."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from kdml.errors import KdmlError


def test_nmi_of_one_query_per_class_against_a_gallery_is_not_trivially_one():
    """With a query/gallery split (In-Shop, a CSV's is_query/is_gallery flags) NMI clusters
    the queries alone into as many clusters as they have classes: with one query per class
    (a common protocol) every query is its own cluster and NMI is exactly 1 whatever the
    embedding, beside a Recall@1 of 0 (an In-Shop fixture scored recall@1 0.0, nmi 1.0)."""
    from kdml.evaluation.clustering import clustering_nmi
    from kdml.evaluation.retrieval import retrieval_metrics

    rng = np.random.default_rng(0)
    queries = torch.from_numpy(rng.standard_normal((6, 8)).astype(np.float32))
    gallery = torch.from_numpy(rng.standard_normal((18, 8)).astype(np.float32))
    query_labels = torch.arange(6)
    gallery_labels = torch.arange(18) // 3  # not arange(24) % 6 joined: a swap would show
    results = retrieval_metrics(queries, query_labels, ks=(1,), reference=gallery,
                                reference_labels=gallery_labels, nmi=True)
    # random embeddings: a clustering of them says nothing of the classes
    assert results.get("nmi", 0.0) < 0.99, results
    # the queries and the gallery are clustered together
    assert results["nmi"] == clustering_nmi(torch.cat([queries, gallery]),
                                            torch.cat([query_labels, gallery_labels]))


def test_chart_nmi_against_a_gallery_clusters_the_queries_and_the_gallery():
    """The Atlas metrics' NMI had the same fault: one query per class, each its own cluster."""
    from kdml.evaluation.charts import chart_clustering_nmi, chart_retrieval_metrics

    rng = np.random.default_rng(1)
    queries, gallery = rng.standard_normal((6, 2)), rng.standard_normal((18, 2))
    # joined, neither is periodic (as arange(24) % 2 was): queries and gallery swapped, or
    # the gallery's charts given the queries', would score another NMI
    query_charts, gallery_charts = np.arange(6) % 2, np.arange(18) // 9
    query_labels, gallery_labels = np.arange(6), np.arange(18) // 3
    results = chart_retrieval_metrics(queries, query_charts, query_labels, ks=(1,),
                                      reference_coords=gallery,
                                      reference_chart_index=gallery_charts,
                                      reference_labels=gallery_labels)
    assert results["nmi"] < 0.99
    assert results["nmi"] == pytest.approx(chart_clustering_nmi(
        np.concatenate([queries, gallery]), np.concatenate([query_charts, gallery_charts]),
        np.concatenate([query_labels, gallery_labels])))


def test_a_weights_file_holding_nan_is_refused_naming_the_file(tmp_path):
    """A damaged local weights file whose tensors hold NaN loaded without a word ("loaded 483
    tensors"); the first step then stopped with "the 'am_softmax' term became NaN ... Lower
    the learning rates or the regularizer weight", which sends the user to tune a run whose
    fault is the file."""
    from kdml.models.weights import load_weights

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    state = model.state_dict()
    state["0.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "weights.pth")
    with pytest.raises(KdmlError, match=r"(?i)nan|finite") as refused:
        load_weights(torch.nn.Sequential(torch.nn.Linear(3, 2)), tmp_path / "weights.pth",
                     report=lambda line: None)
    assert "weights.pth" in str(refused.value)


def test_a_weights_file_with_an_infinite_parameter_is_refused_but_a_minus_inf_mask_loads(
        tmp_path):
    from kdml.models.weights import load_weights

    def model():
        module = torch.nn.Sequential(torch.nn.Linear(3, 2))
        module.register_buffer("mask", torch.zeros(2))
        return module

    state = model().state_dict()
    state["mask"][0] = float("-inf")
    torch.save(state, tmp_path / "masked.pth")
    loaded = model()
    load_weights(loaded, tmp_path / "masked.pth", report=lambda line: None)
    assert loaded.mask[0] == float("-inf")
    state["0.bias"][1] = float("inf")
    torch.save(state, tmp_path / "broken.pth")
    with pytest.raises(KdmlError, match=r"broken\.pth: 0\.bias holds NaN or infinite values"):
        load_weights(model(), tmp_path / "broken.pth", report=lambda line: None)


def _photo(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


@pytest.mark.parametrize(("header", "fourth"), [
    ("path,label,split,Label", lambda number, name: str(number % 4)),
    ("path,label,split,split", lambda number, name: "test"),
    ("Path,label,split,path", lambda number, name: name),
])
def test_a_csv_header_naming_one_column_twice_is_refused(tmp_path, header, fourth):
    """Column names are read without regard to case, so ``label`` and ``Label`` (or a
    column written twice) name one column: kdml silently read the first and ignored the
    other, training on labels or a split the user may not have meant."""
    from kdml.data.formats.csv_list import load_csv

    rows = []
    for number in range(8):
        name = f"imgs/{number}.png"
        _photo(tmp_path / name, 30 * number)
        split = "train" if number % 4 < 2 else "test"
        rows.append(f"{name},{number % 4},{split},{fourth(number, name)}")
    (tmp_path / "list.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    with pytest.raises(KdmlError, match=r"line 1: the header names the '(label|split|path)' "
                                        r"column 2 times \(\w+, \w+: names are read"):
        load_csv(tmp_path / "list.csv")


def _small_classes(path):
    """A feature file of 4 classes with 5 source samples each: fewer than DTML's k1 = 5
    same-class neighbours (a sample's own class holds 4 others)."""
    rng = np.random.default_rng(0)
    labels = np.arange(40) % 4
    features = rng.standard_normal((40, 6)).astype(np.float32)
    domain = np.array(["source"] * 20 + ["target"] * 20)
    np.savez(path, X=features, y=labels, domain=domain)
    return path


def test_a_dtml_run_with_small_classes_warns_in_kdml_words_and_logs_it(tmp_path, capsys):
    from kdml import cli

    features = _small_classes(tmp_path / "features.npz")
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["train", "dtml", "--dataset", f"npz:{features}", "epochs=1",
                         "data.batch_size=0", "eval.nmi=false",
                         "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    escaped = [str(w.message) for w in caught if "MarginalFisherLoss" in str(w.message)]
    # the user is told, in kdml's one-line form, not by Python's warning machinery
    assert not escaped, f"a raw Python warning escaped the CLI: {escaped[0][:80]}"
    assert "UserWarning" not in err and "marginal_fisher.py" not in err
    assert "k1" in err
    # and train.log, which README says keeps each session's warnings, records it
    assert "k1" in (out / "train.log").read_text()


@pytest.mark.parametrize("overrides", [["epochs=3", "train.epochs=4"],
                                       ["train.epochs=3", "train.epochs=4"]])
def test_a_later_override_of_one_setting_wins_as_the_readme_says(capsys, overrides):
    """Two overrides of one setting: the later wins (README: a script adds one change to a
    list of overrides; the tests' own tiny settings rely on it), under either spelling."""
    from kdml import cli

    assert cli.main(["config", "jrd", *overrides]) == 0
    assert "\n  epochs: 4\n" in capsys.readouterr().out
