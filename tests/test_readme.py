"""The README's library examples run as written (on small random data in place of a user's)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def library_examples() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Using the library"):text.index("## Layout")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def run(code: str) -> dict:
    generator = torch.Generator().manual_seed(0)
    namespace = {"embeddings": torch.randn(16, 8, generator=generator),
                 "labels": torch.arange(16) % 4,
                 "images": torch.rand(16, 1, 28, 28, generator=generator)}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_the_readmes_library_examples_run():
    metrics, regularized, own_backbone = (run(code) for code in library_examples())
    assert set(metrics["metrics"]) == {"recall@1", "recall@2", "recall@4", "recall@8", "map@r",
                                       "r_precision", "nmi"}
    assert math.isfinite(regularized["loss"].item())
    output = own_backbone["output"]
    assert math.isfinite(output.loss.item()) and output.embeddings.shape == (16, 64)


def test_the_readme_regularizes_the_unit_embeddings_the_triplet_loss_compares():
    """PML's TripletMarginLoss L2-normalises the embeddings (its default LpDistance), JRS takes
    them as given: the example had regularized the raw ones (on digits, R@1 0.87-0.89 where
    the triplet loss alone gave 0.975-0.983 and JRS on the unit vectors 0.975-0.986)."""
    _, regularized, _ = library_examples()
    assert "jrs([embeddings]" not in regularized
    namespace = run(regularized)
    unit = torch.nn.functional.normalize(namespace["embeddings"], dim=1)
    torch.testing.assert_close(namespace["unit"], unit)
    expected = (namespace["triplet_and_fisher"](namespace["embeddings"], namespace["labels"])
                + namespace["jrs"]([unit], namespace["labels"]))
    torch.testing.assert_close(namespace["loss"], expected)


def test_the_readme_s_own_backbone_sets_feature_size_as_mypy_takes_it():
    """``backbone.feature_size = 256`` on an ``nn.Sequential`` is a mypy error (torch types a
    module's attributes as Tensor | Module), while README says mypy checks a user's calls: the
    example declares it on its own module class."""
    *_, own_backbone = library_examples()
    assert not re.search(r"^\w+\.feature_size\s*=", own_backbone, flags=re.MULTILINE)
    assert run(own_backbone)["backbone"].feature_size == 256


def test_am_softmax_under_vmap_is_as_readme_says():
    """README: am_softmax_loss works under vmap over the cosines with the labels held fixed;
    vmap over the labels too fails (their range check reads them): it had said "all four"."""
    readme = " ".join(README.read_text().split())
    assert "`am_softmax_loss` over the cosines with the labels held fixed" in readme
    from kdml.losses import am_softmax_loss

    cosines, labels = torch.rand(3, 8, 4) * 2 - 1, torch.randint(0, 4, (3, 8))
    per_batch = torch.func.vmap(lambda c: am_softmax_loss(c, labels[0], 30.0, 0.35))(cosines)
    assert per_batch.shape == (3,)
    with pytest.raises(RuntimeError, match="vmap"):
        torch.func.vmap(lambda c, y: am_softmax_loss(c, y, 30.0, 0.35))(cosines, labels)
