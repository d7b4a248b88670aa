"""The cross-domain journeys (DTML family, domain pairs, ``npz:`` feature files) as a user
walks them: a run's target scored again with ``kdml eval``, its own or another pair's. An
audit found that training warned of a labelled target that scores the data rather than the
model (all of one class: the target retrieval metrics are trivially 1; none of a source
class: ``source_nn_accuracy`` is 0 whatever the model), while ``kdml eval`` printed the same
numbers without a word."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kdml import cli
from kdml.errors import KdmlError

SINGLE_CLASS = "every labelled target sample of"
NO_SOURCE_CLASS = "has a source class"


def _pair(path: Path, target_labels: list[int], source_classes: tuple[int, ...] = (0, 1, 2)
          ) -> str:
    """An ``npz:`` pair: 8 source samples of each of ``source_classes`` and one target sample
    per entry of ``target_labels`` (-1 = unlabelled), 4 features near their class's centre."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((20, 4)) * 3
    source = [c for c in source_classes for _ in range(8)]
    labels = np.array(source + target_labels)
    features = centres[np.maximum(labels, 0)] + 0.1 * rng.standard_normal((len(labels), 4))
    domain = np.array(["source"] * len(source) + ["target"] * len(target_labels))
    np.savez(path, X=features.astype(np.float32), y=labels, domain=domain)
    return f"npz:{path}"


def _train_pca(dataset: str, out: Path) -> int:
    """The ``pca`` recipe, fitted in closed form: a domain run in a second."""
    return cli.main(["train", "pca", "--dataset", dataset, "--out", str(out), "--no-progress",
                     "train.device=cpu", "eval.ks=[1]", "eval.nmi=false"])


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, str]:
    """Three pairs of one source: a target of every source class, one whose labelled samples
    are all of class 1 (two unlabelled), and one whose classes the source lacks."""
    folder = tmp_path_factory.mktemp("pairs")
    return {"good": _pair(folder / "good.npz", [0, 0, 1, 1, 2, 2]),
            "one_class": _pair(folder / "one_class.npz", [1, 1, 1, -1, -1]),
            "other_classes": _pair(folder / "other_classes.npz", [7, 7, 8, 8])}


@pytest.fixture(scope="module")
def good_run(pairs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good") / "run"
    assert _train_pca(pairs["good"], out) == 0
    return out


def _eval(capsys, run: Path, *args: str) -> tuple[str, str]:
    capsys.readouterr()  # what came before: a training's own warnings
    assert cli.main(["eval", str(run), "--no-progress", *args]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_eval_of_another_pair_warns_of_a_target_of_one_labelled_class(pairs, good_run,
                                                                      capsys):
    """``kdml eval RUN --dataset npz:NEW`` of a target whose labelled samples share one class
    printed Recall@1 = MAP@R = 1 with no warning; training on the same pair warns."""
    out, err = _eval(capsys, good_run, "--dataset", pairs["one_class"])
    assert "recall@1           1.0000" in out, out
    assert err.count(SINGLE_CLASS) == 1 and "trivially 1" in err, err
    assert err.startswith("kdml: warning: ") and "one_class/target" in err, err
    _, err = _eval(capsys, good_run, "--dataset", pairs["good"])  # a sound pair: no word
    assert SINGLE_CLASS not in err and NO_SOURCE_CLASS not in err, err


def test_eval_of_another_pair_warns_of_a_target_of_no_source_class(pairs, good_run, capsys):
    """A target of classes 7 and 8 against a source of 0-2 scores source_nn_accuracy 0
    whatever the model: eval says so, as training does."""
    out, err = _eval(capsys, good_run, "--dataset", pairs["other_classes"])
    assert "source_nn_accuracy 0.0000" in out, out
    assert err.count(NO_SOURCE_CLASS) == 1 and "0 whatever the model" in err, err
    assert SINGLE_CLASS not in err, err


def test_eval_of_a_run_s_own_single_class_target_warns_as_its_training_did(pairs, tmp_path,
                                                                           capsys):
    """The run's own pair, scored again by ``kdml eval RUN``: the warning training gave
    before its scores comes again before eval's, once."""
    run = tmp_path / "run"
    assert _train_pca(pairs["one_class"], run) == 0
    assert SINGLE_CLASS in capsys.readouterr().err  # training's, as before
    _, err = _eval(capsys, run)
    assert err.count(SINGLE_CLASS) == 1, err
    assert (run / "eval.json").is_file()  # warned, and scored as before


@pytest.mark.parametrize("command", ["eval", "embed", "index"])
def test_another_dataset_misnamed_for_a_domain_run_lists_the_pairs_and_npz(good_run, tmp_path,
                                                                         capsys, command):
    """``kdml eval RUN --dataset mnist5k-`` (the shell took the '>' of an unquoted pair) said
    "did you mean 'mnist5k'?" and listed the single datasets alone, neither the domain pairs
    nor ``npz:PATH``: the only data a DTML run's model takes. The refusal is kdml train's."""
    out = [] if command == "eval" else ["--out", str(tmp_path / (
        "e.npz" if command == "embed" else "index"))]
    capsys.readouterr()
    assert cli.main([command, str(good_run), "--dataset", "mnist5k-", "--no-progress",
                     *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: unknown dataset 'mnist5k-'; ") and err.count("\n") == 1
    assert "did you mean" not in err and "mnist5k->digits, digits->mnist5k" in err, err
    assert err.endswith("npz:PATH (quote domain pairs in the shell: --dataset "
                        "'mnist5k->digits')\n"), err


def test_a_feature_file_given_without_its_prefix_is_refused_naming_npz(good_run, pairs,
                                                                        capsys):
    """A path to the .npz itself, without ``npz:``, had been refused listing ``folder:DIR or
    csv:FILE`` as the path formats: the one it needs was not among them."""
    path = pairs["good"].removeprefix("npz:")
    capsys.readouterr()
    assert cli.main(["eval", str(good_run), "--dataset", path, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: unknown dataset '{path}'; ") and "npz:PATH" in err, err


def test_a_source_of_classes_not_numbered_from_0_is_scored_and_embedded_by_its_labels(
        tmp_path, capsys):
    """Training remaps the source's classes 3, 7 and 9 to 0..2; the source-NN accuracy and
    ``kdml embed --split train`` must speak of the file's labels again (the target's are
    never remapped). Well-separated classes: every target sample's nearest source sample is
    of its class, so the accuracy is 1, and 0 had the remapped labels been compared."""
    dataset = _pair(tmp_path / "gaps.npz", [3, 3, 7, 7, 9, 9], source_classes=(3, 7, 9))
    run = tmp_path / "run"
    assert _train_pca(dataset, run) == 0
    assert "source_nn_accuracy 1.0000" in capsys.readouterr().out
    assert cli.main(["embed", str(run), "--split", "train", "--out", str(tmp_path / "s.npz"),
                     "--no-progress"]) == 0
    with np.load(tmp_path / "s.npz") as embedded:
        assert sorted(set(embedded["labels"].tolist())) == [3, 7, 9]


@pytest.mark.parametrize(("written", "meant"), [
    ("mnist5k -> digits", "mnist5k->digits"), ("mnist5k-->digits", "mnist5k->digits"),
    ("MNIST5K->digits", "mnist5k->digits"), ("digit->mnist5k", "digits->mnist5k")])
def test_a_pair_written_otherwise_names_the_pair_meant(written, meant):
    """Spaces around the arrow, a longer arrow, capitals or a missing letter: the refusal
    listed the pairs but named none as meant, as kdml's other unknown names do."""
    from kdml.data.domains import load_domain_pair

    with pytest.raises(KdmlError, match=f"^unknown domain pair '{written}' \\(did you mean "
                                        f"'{meant}'\\?\\); choose one of: "):
        load_domain_pair(written)
