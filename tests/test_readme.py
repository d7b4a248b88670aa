"""The README's library examples run as written (on small random data in place of a user's)."""

from __future__ import annotations

import math
import re
from pathlib import Path

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
