"""Numbers the documentation states from a computation that the tests can redo in seconds:
the offline datasets' counts (docs/datasets.md), the digit pairs' source-NN accuracies on
their own features and through the untrained DTML network (docs/datasets.md, docs/recipes.md,
docs/findings.md), the proxies' initial norms (docs/recipes.md), the Fashion-MNIST test part
docs/inspecting.md searches, and the training minutes docs/reproducing.md and
docs/findings.md quote from the committed run records (``reproduce.json``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from kdml.data.domains import fit_source_pca, load_domain_pair
from kdml.data.offline import load_digits, load_mnist5k
from kdml.evaluation.transfer import source_nn_accuracy

ROOT = Path(__file__).resolve().parents[1]


def flat(doc: str) -> str:
    """``doc``'s text with every run of white space one space (its lines joined)."""
    return " ".join((ROOT / doc).read_text(encoding="utf-8").split())


def said(doc: str, pattern: str) -> tuple[str, ...]:
    """The groups of ``pattern``'s first match in ``doc``'s flat text, which must have one."""
    found = re.search(pattern, flat(doc))
    assert found, f"{doc} no longer says {pattern!r}"
    return found.groups()


def number(text: str) -> float:
    """``"2,091"`` as 2091.0."""
    return float(text.replace(",", ""))


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Each digit pair's (source x, source y, target x, target y) on its own 64 features."""
    loaded = {}
    for name in ("mnist5k->digits", "digits->mnist5k"):
        pair = load_domain_pair(name)
        loaded[name] = (pair.source.x.double().numpy(), pair.source.y.numpy(),
                        pair.target.x.double().numpy(), pair.target.y.numpy())
        assert (np.rint(loaded[name][0] * 16) == loaded[name][0] * 16).all()  # counts / 16
    return loaded


def test_datasets_md_gives_the_offline_image_sets_counts_and_shapes():
    """docs/datasets.md's table of the offline datasets: mnist5k 5,000 (500 per digit),
    1x28x28 in [0, 1]; digits 1,797, 1x8x8 in [0, 1]. (mnist1d's row, 5,000 signals of 40,
    is left out: generating it takes most of this file's time.)"""
    text = flat("docs/datasets.md")
    rows = {name: (samples, shape) for name, samples, shape in re.findall(
        r"\| `(mnist5k|digits)` \| ([^|]+) \| ([^|]+) \|", text)}
    assert rows.keys() == {"mnist5k", "digits"}
    for name, load in (("mnist5k", load_mnist5k), ("digits", load_digits)):
        x, y = load()
        counts = [number(n) for n in re.findall(r"\d[\d,]*", rows[name][0])]
        shape = [int(n) for n in re.findall(r"\d+", rows[name][1].split(" in ")[0])]
        assert counts[0] == len(x) == len(y), name
        assert list(x.shape[1:]) == shape, name
        if name == "mnist5k":  # 500 per digit
            assert (torch.bincount(y) == counts[1]).all()
        assert "in [0, 1]" in rows[name][1]
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0, name


def test_datasets_md_gives_the_pairs_exact_source_nn_accuracy_and_their_ties(pairs):
    """docs/datasets.md: "6 and 20 of the targets have two equally near sources ...
    source_nn_accuracy gives 0.7977 and 0.5976" (ties counted as their expectation)."""
    ties = [int(n) for n in said("docs/datasets.md",
                                  r"(\d+) and (\d+) of the targets have two equally near")]
    accuracies = said("docs/datasets.md", r"`kdml\.evaluation\.transfer\.source_nn_accuracy` "
                                          r"gives (\d\.\d{4}) and (\d\.\d{4})")
    for (name, (source, source_y, target, target_y)), tied, accuracy in zip(
            pairs.items(), ties, accuracies, strict=True):
        accuracy_now = source_nn_accuracy(source.astype(np.float32), source_y,
                                          target.astype(np.float32), target_y)
        assert f"{accuracy_now:.4f}" == accuracy, name
        # the features are counts / 16: as whole counts in float64, every squared distance
        # below is exact, so its equalities are the true ties
        counts_t, counts_s = np.rint(target * 16.0), np.rint(source * 16.0)
        squared = ((counts_t**2).sum(1)[:, None] + (counts_s**2).sum(1)[None, :]
                   - 2.0 * counts_t @ counts_s.T)
        nearest = squared == squared.min(axis=1, keepdims=True)
        assert int((nearest.sum(axis=1) == 2).sum()) == tied, name
        assert int((nearest.sum(axis=1) > 2).sum()) == 0, name


def test_datasets_md_gives_the_naive_resize_s_source_nn_accuracy():
    """docs/datasets.md: "The naive 28x28 -> 8x8 area resize gives 0.460 for
    mnist5k->digits", against 0.797 for kdml's optdigits conversion."""
    (accuracy,) = said("docs/datasets.md", r"The naive 28x28 -> 8x8 area resize gives "
                                           r"(\d\.\d{3}) for `mnist5k->digits`")
    images, labels = load_mnist5k()
    digits, digit_labels = load_digits()
    resized = F.interpolate(images, size=(8, 8), mode="area").flatten(1)
    assert f"{source_nn_accuracy(resized, labels, digits.flatten(1), digit_labels):.3f}" == (
        accuracy)


def test_the_docs_give_the_untrained_dtml_network_s_source_nn_accuracy():
    """docs/recipes.md and docs/findings.md: the identity-initialised 64-64-32 network keeps
    the first 32 inputs, "the untrained network's source-NN accuracy on mnist5k->digits is
    0.590" on the raw digits and 0.789 on the source's principal axes (data.pca_dim=64)."""
    from kdml.training.recipes.dtml import DTMLMethod, DTMLParams

    raw, axes = said("docs/recipes.md",
                     r"the untrained network's source-NN accuracy on `mnist5k->digits` is "
                     r"(\d\.\d{3}), .*? the top 32 components \((\d\.\d{3})\)")
    assert said("docs/findings.md", r"untrained, it scored a source-NN accuracy of "
                                    r"(\d\.\d{3}) on `mnist5k->digits` \((\d\.\d{3}) on the "
                                    r"source's principal axes") == (raw, axes)
    network = DTMLMethod(DTMLParams(), 64).eval()
    assert [layer.out_features for layer in network.backbone.layers] == [64, 32]
    pair = load_domain_pair("mnist5k->digits")
    for data, expected in ((pair, raw), (fit_source_pca(pair, 64), axes)):
        with torch.no_grad():
            source, target = network.embed(data.source.x), network.embed(data.target.x)
        accuracy = source_nn_accuracy(source, data.source.y, target, data.target.y)
        assert f"{accuracy:.3f}" == expected


def test_recipes_md_gives_the_proxies_initial_norms():
    """docs/recipes.md: "At d = 512 and C = 100 the code's initial proxies have norm about
    1.3, PML's about 22.6" (``method.proxy_init`` kaiming and normal)."""
    from torch import nn

    from kdml.training.recipes.jrd import JRDMethod, JRDParams

    size, classes, kaiming, normal = said(
        "docs/recipes.md", r"At d = (\d+) and C = (\d+) the code's initial proxies have norm "
                           r"about (\d+\.\d), PML's about (\d+\.\d)")

    class Backbone(nn.Module):
        feature_size = 8

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return images

    torch.manual_seed(0)
    for init, expected in (("kaiming", kaiming), ("normal", normal)):
        method = JRDMethod.from_params(Backbone(), embedding_size=int(size),
                                       num_classes=int(classes),
                                       params=JRDParams(proxy_init=init))
        proxies = method.head.proxies.detach()
        assert tuple(proxies.shape) == (int(size), int(classes))
        assert f"{proxies.norm(dim=0).mean().item():.1f}" == expected, init


def test_inspecting_md_s_fashion_mnist_test_part_is_as_it_says():
    """docs/inspecting.md: the class-disjoint test part holds "35,000 test images of the
    unseen classes 5-9", and "test[30000] is t10k image 0" (an ankle boot), "after the 30,000
    test images taken from the train file"."""
    from kdml.config import DataConfig
    from kdml.data.prepare import prepare_data
    from kdml.data.registry import open_dataset
    from kdml.errors import KdmlError

    try:
        splits = prepare_data(DataConfig(dataset="fashion-mnist", split="class-disjoint"))
    except KdmlError:
        pytest.skip("Fashion-MNIST's files are not on this machine")
    (count,) = said("docs/inspecting.md", r"([\d,]+) test images of the unseen classes 5-9")
    (position,) = said("docs/inspecting.md", r"`test\[(\d+)\]` is t10k image 0")
    test = splits.test
    assert len(test) == number(count)
    assert sorted(set(test.y.tolist())) == [5, 6, 7, 8, 9]
    assert test.source_of(int(position)) == f"fashion-mnist/test[{position}]"
    assert (int(test.y[int(position)]), test.class_name(9)) == (9, "Ankle boot")
    files = open_dataset("fashion-mnist")  # the train file's images, then t10k's
    t10k_first = int(files.parts["test"][0])
    assert torch.equal(torch.as_tensor(test.x[int(position)]),
                       torch.as_tensor(files.dataset.x[t10k_first]))
    # the test images before it are the train file's: its 60,000 hold 6,000 of each class
    assert int(position) == 5 * 6000
    assert len(test) - int(position) == 5 * 1000  # and t10k's 1,000 of each after them


def record_minutes(folder: str) -> list[tuple[dict, str, float]]:
    """Each committed run of ``results/folder``: its config, the day its first session
    started (train.log) and its training minutes (``reproduce.json``'s wall time)."""
    runs = []
    for timing in sorted((ROOT / "results" / folder).glob("*/seed-*/reproduce.json")):
        config = yaml.safe_load((timing.parent / "config.yaml").read_text(encoding="utf-8"))
        log = (timing.parent / "train.log").read_text(encoding="utf-8")
        day = next(line for line in log.splitlines() if " start epoch " in line)[:10]
        runs.append((config, day, json.loads(timing.read_text())["wall_s"] / 60))
    return runs


def span(minutes: list[float], places: int) -> tuple[str, str]:
    """The shortest and longest of ``minutes``, as a doc writes them."""
    return f"{min(minutes):.{places}f}", f"{max(minutes):.{places}f}"


def test_reproducing_md_gives_the_cpu_table2_runs_minutes_as_their_records_have_them():
    """docs/reproducing.md: "about a minute an mnist5k run" held for the 51 runs of
    2026-11-30 only; the records of the d = 2 column's other 24 runs and of the ablation's 30
    (2026-11-25 and 28) took 3.2 to 13.0 minutes. And "15 to 48 minutes a Fashion-MNIST run,
    2,091 minutes for the 75"."""
    quick, quick_low, quick_high, slow_table, slow_ablation, slow_low, slow_high = said(
        "docs/reproducing.md", r"the (\d+) `mnist5k` runs of 2026-11-30 took (\d+\.\d) to "
                               r"(\d+\.\d) minutes, while the d = 2 column's other (\d+) and "
                               r"the ablation's (\d+), trained on 2026-11-25 and 28 with a "
                               r"thread count not recorded, took (\d+\.\d) to (\d+\.\d)\)")
    ten_epochs = [(config, day, minutes) for config, day, minutes
                  in record_minutes("simclr-table2-cnn") + record_minutes("simclr-ablation")
                  if config["train"]["epochs"] == 10 and not config["method"].get("proj_hidden")]
    newer = [minutes for _, day, minutes in ten_epochs if day == "2026-11-30"]
    older = [minutes for _, day, minutes in ten_epochs if day in ("2026-11-25", "2026-11-28")]
    assert len(newer) + len(older) == len(ten_epochs) == 75 + 30
    assert (len(newer), span(newer, 1)) == (int(quick), (quick_low, quick_high))
    assert len(older) == int(slow_table) + int(slow_ablation)
    assert span(older, 1) == (slow_low, slow_high)
    low, high, total, count = said("docs/reproducing.md", r"and (\d+) to (\d+) minutes a "
                                   r"Fashion-MNIST run, ([\d,]+) minutes for the (\d+),")
    fashion = [minutes for config, _, minutes in record_minutes("simclr-table2-cnn-fashion-mnist")
               if not config["method"].get("proj_hidden")]
    assert len(fashion) == int(count)
    assert span(fashion, 0) == (low, high) and f"{sum(fashion):,.0f}" == total


def test_findings_gives_the_fashion_mnist_cpu_table2_columns_minutes_as_recorded():
    """docs/findings.md: the d = 2 column "25 runs, 443 minutes", d = 4 "25 runs of 21.7 to
    46.0 minutes", d = 8 "25 runs of 27.4 to 48.4 minutes, 928.5 minutes in all"."""
    by_dim: dict[int, list[float]] = {}
    for config, _, minutes in record_minutes("simclr-table2-cnn-fashion-mnist"):
        if not config["method"].get("proj_hidden"):
            by_dim.setdefault(config["method"]["dim"], []).append(minutes)
    runs2, total2 = said("docs/findings.md", r"five seeds, (\d+) runs, (\d+) minutes of this "
                                             r"CPU")
    assert (len(by_dim[2]), f"{sum(by_dim[2]):.0f}") == (int(runs2), total2)
    runs4, low4, high4 = said("docs/findings.md", r"The d = 4 column \(trained [^)]*?(\d+) "
                                                  r"runs of (\d+\.\d) to (\d+\.\d) minutes")
    assert (len(by_dim[4]), *span(by_dim[4], 1)) == (int(runs4), low4, high4)
    runs8, low8, high8, total8 = said(
        "docs/findings.md", r"The d = 8 column \(trained [^)]*?(\d+) runs of (\d+\.\d) to "
                            r"(\d+\.\d) minutes, (\d+\.\d) minutes in all")
    assert (len(by_dim[8]), *span(by_dim[8], 1), f"{sum(by_dim[8]):.1f}") == (
        int(runs8), low8, high8, total8)
