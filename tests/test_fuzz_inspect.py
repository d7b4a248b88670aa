"""Workflow fuzzing of the inspection commands (analyze, eval --dataset) on tiny runs."""

from __future__ import annotations

from fixtures_array_sets import make_csv_list

import kdml.inspection.analysis as analysis
from kdml import cli

TINY = ["--no-progress", "train.epochs=1", "train.steps_per_epoch=2", "eval.nmi=false",
        "model.embedding_size=8", "train.device=cpu", "data.num_workers=0"]


def kdml(*args) -> int:
    return cli.main([str(arg) for arg in args])


def test_generalization_of_a_query_gallery_split_uses_its_whole_test_part(tmp_path, monkeypatch,
                                                                          capsys):
    """The unseen classes of a split with a query and a gallery part (a CSV's flags, In-Shop)
    are its queries and its gallery: ``kdml analyze generalization`` had scored the queries
    alone, silently dropping the gallery (here two thirds of the unseen samples; In-Shop's
    12,612 of 26,830), which moved d_H from 0.80 to 0.68 on a CSV run of 20 queries and 40
    gallery images."""
    csv_file = make_csv_list(tmp_path / "data", classes=4, per_class=12, size=16,
                             query_gallery=True)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"csv:{csv_file}", "--out", run, *TINY,
                "data.batch_size=8", "data.resize=16", "data.image_size=16") == 0
    seen_counts = []
    original = analysis.generalization_terms

    def counting(seen, seen_labels, unseen, unseen_labels, **settings):
        seen_counts.append((len(seen), len(unseen)))
        return original(seen, seen_labels, unseen, unseen_labels, **settings)

    monkeypatch.setattr(analysis, "generalization_terms", counting)
    capsys.readouterr()
    assert kdml("analyze", "generalization", run, "--no-progress", "--repeats", 2) == 0
    # 2 test classes of 12 images: 6 queries and 6 gallery images each
    assert seen_counts == [(24, 24)]


def test_another_domain_pair_is_not_said_to_be_unseen_by_training(tmp_path):
    """``kdml eval RUN --dataset D`` may score the samples the run trained on: a DTML run of
    ``mnist5k->digits`` scored on ``digits->mnist5k`` is scored on its own 5,000 labelled
    training samples. Its ``test set:`` line had said "5,000 samples of the target domain,
    whose labels training never sees"; for another dataset kdml says only what the part is
    (docs/inspecting.md: the run may have trained on D's classes)."""
    from kdml.data.splits import DOMAIN, OTHER_TEST_SETS

    assert "never" not in OTHER_TEST_SETS[DOMAIN]
    assert "not seen" not in OTHER_TEST_SETS[DOMAIN]
    assert OTHER_TEST_SETS[DOMAIN] == "the pair's target domain"
