"""MSimCLR and SimCLR (Korman) by the authors' code and by kdml, on one split (issue 12).

The authors' code (github.com/ekorman/neurve, read at commit 1ea5661) trains on torchvision's
datasets, which it downloads. This script assembles the same pieces its
``experiments/simclr.py`` ``main`` does (``SimCLRMfld`` or ``SimCLR`` with ResNet-18,
``SimCLRDataset``'s augmentations, Adam 1e-4 with weight decay 2e-6, batch 128, shuffled,
4 loader workers, ``SimCLRMfldTrainer`` or ``SimCLRTrainer``) and trains them on the training
part of a kdml split instead. kdml's recipe trains on the same part, and kdml's piecewise-linear
probe scores both on the same held-out samples, each embedded as its own code embeds them for
evaluation (neurve: ``ToTensor`` of the 28-pixel images, as its linear evaluation does).

The one setting passed to neurve that its script's default does not give is tau = 1, the paper's
for MNIST and Fashion-MNIST (Table 1) and kdml's; the script's default is 0.5 (``--tau``).
neurve's own probe (``CoordLinear`` trained with Adam) is not run: one probe scores both.

It needs torchvision, so it runs on a GPU machine's image, and a copy of neurve's source
(``--neurve``, e.g. ``git clone https://github.com/ekorman/neurve .neurve`` where there is
internet). neurve logs to tensorboardX; where that is not installed, a writer that discards
the scalars stands in, since nothing here reads them.

    PYTHONPATH=src python benchmarks/neurve_side_by_side.py --neurve .neurve \\
        --dataset mnist5k --dim 2 --charts 16 --epochs 100 --seeds 0 1 2

Prints each side's accuracy as soon as it is known, then one Markdown row per seed and a mean
row; ``--out`` gets the rows as JSON, rewritten after each seed.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from machine import machine_description
from measure import non_negative_count, positive_count
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from kdml.config import RunConfig, resolve_config
from kdml.data.prepare import prepare_data
from kdml.data.splits import DataSplits
from kdml.data.transforms import to_unit_float
from kdml.errors import KdmlError
from kdml.evaluation.charts import piecewise_linear_accuracy
from kdml.file_write import check_writable_folder
from kdml.reproduce.catalog.atlas import simclr_split
from kdml.training.build import resolve_device
from kdml.training.recipes import get_recipe
from kdml.training.run_folder import check_json_replaceable, write_json
from kdml.training.trainer import train


class LabelledImages(Dataset):
    """(PIL image, label) pairs, as torchvision's ``MNIST`` yields them to neurve's
    ``SimCLRDataset``. ``images``: uint8 ``[N, 1, H, W]``."""

    def __init__(self, images: torch.Tensor, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[index, 0].numpy()), int(self.labels[index])


def kdml_config(args: argparse.Namespace, seed: int) -> RunConfig:
    """The kdml recipe's defaults (Appendix A.1) on the chosen data and the split of the
    report's Table 2, with ``--set`` on top."""
    name = "msimclr" if args.charts else "simclr"
    recipe = get_recipe(name)
    overrides = [f"data.dataset={args.dataset}", f"data.split={simclr_split(args.dataset)}",
                 f"method.dim={args.dim}", f"method.tau={args.tau}",
                 f"train.epochs={args.epochs}", f"train.seed={seed}",
                 f"train.device={args.device}", *args.set]
    if args.charts:
        overrides.append(f"method.n_charts={args.charts}")
    if args.data_root:
        overrides.append(f"data.root={args.data_root}")
    return resolve_config(name, recipe.params, recipe.defaults, overrides=overrides)


def split_images(splits: DataSplits) -> dict[str, tuple[torch.Tensor, np.ndarray]]:
    """uint8 ``[N, 1, H, W]`` images and the dataset's own labels of each part."""
    classes = np.asarray(splits.train_classes)
    parts = {}
    for part, dataset, labels in (("train", splits.train, classes[splits.train.labels.numpy()]),
                                  ("test", splits.test, splits.test.labels.numpy())):
        images = to_unit_float(torch.stack([dataset.load(i) for i in range(len(dataset))]))
        if images.ndim != 4 or images.shape[1] != 1:
            raise SystemExit(f"{splits.train.name}: expected 1-channel images [N, 1, H, W], "
                             f"got {tuple(images.shape)}")
        parts[part] = ((images * 255).round().to(torch.uint8), labels)
    return parts


def import_neurve(path: Path) -> types.SimpleNamespace:
    """neurve's modules from a source checkout at ``path``."""
    if not (path / "neurve" / "contrastive").is_dir():
        raise SystemExit(f"{path} is not a checkout of github.com/ekorman/neurve "
                         "(no neurve/contrastive); pass --neurve DIR")
    try:
        importlib.import_module("tensorboardX")
    except ModuleNotFoundError:
        sys.modules["tensorboardX"] = types.SimpleNamespace(SummaryWriter=_DiscardingWriter)
    sys.path.insert(0, str(path))
    try:
        modules = {name: importlib.import_module(f"neurve.contrastive.{name}")
                   for name in ("dataset", "models", "trainer")}
    except ImportError as error:  # torchvision, most likely: it does not import on every torch
        raise SystemExit(f"neurve does not import here ({error}); run this where torchvision "
                         "imports, e.g. a GPU machine's image") from None
    return types.SimpleNamespace(**modules)


class _DiscardingWriter:
    """Stands in for tensorboardX's SummaryWriter: neurve's trainer logs its losses to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass


def train_neurve(neurve: types.SimpleNamespace, args: argparse.Namespace,
                 train_set: LabelledImages, seed: int, out: Path) -> torch.nn.Module:
    """experiments/simclr.py's ``main`` up to its linear evaluation, on ``train_set``."""
    torch.manual_seed(seed)
    if args.charts:
        net = neurve.models.SimCLRMfld(backbone=args.backbone, in_channels=1, dim_z=args.dim,
                                       n_charts=args.charts, proj_dim=64)
    else:
        net = neurve.models.SimCLR(backbone=args.backbone, in_channels=1, dim_z=args.dim,
                                   proj_dim=64)
    loader = DataLoader(neurve.dataset.SimCLRDataset(train_set), batch_size=128, shuffle=True,
                        num_workers=args.workers)
    opt = torch.optim.Adam(params=net.parameters(), lr=1e-4, weight_decay=2e-6)
    common = dict(net=net, tau=args.tau, opt=opt, out_path=str(out), data_loader=loader,
                  use_wandb=False)
    if args.charts:
        trainer = neurve.trainer.SimCLRMfldTrainer(reg_loss_weight=20, q_loss_weight=0.1,
                                                   **common)
    else:
        trainer = neurve.trainer.SimCLRTrainer(**common)
    trainer.train(n_epochs=args.epochs, save_ckpt_freq=np.inf)
    return trainer.net.eval()


@torch.no_grad()
def neurve_probe(net: torch.nn.Module, parts: dict[str, tuple[torch.Tensor, np.ndarray]],
                 charts: int, batch: int = 512) -> float:
    """kdml's piecewise-linear probe on neurve's codes (argmax chart, sigmoid coordinates), or
    the ordinary linear probe on SimCLR's embeddings."""
    device = next(net.parameters()).device
    codes = {}
    for part, (images, _) in parts.items():
        outputs = [net.encode(to_unit_float(images[i:i + batch]).to(device))
                   for i in range(0, len(images), batch)]
        if charts:
            q = torch.cat([o[0] for o in outputs]).cpu()
            coords = torch.cat([o[1] for o in outputs]).cpu()  # [N, n, d], pre-sigmoid
            index = q.argmax(1)
            codes[part] = (coords[torch.arange(len(index)), index], index)
        else:
            embedded = torch.cat(outputs).cpu()
            codes[part] = (embedded, torch.zeros(len(embedded), dtype=torch.long))
    (train_codes, train_index), (test_codes, test_index) = codes["train"], codes["test"]
    return piecewise_linear_accuracy(train_codes, train_index, parts["train"][1], test_codes,
                                     test_index, parts["test"][1],
                                     sigmoid=bool(charts))["accuracy"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--neurve", type=Path, default=Path(".neurve"),
                        help="a checkout of github.com/ekorman/neurve")
    parser.add_argument("--dataset", default="mnist5k", help="mnist5k, mnist or fashion-mnist")
    parser.add_argument("--data-root", default="", help="folder of an on-disk dataset")
    parser.add_argument("--dim", type=positive_count, default=2)
    parser.add_argument("--charts", type=non_negative_count, default=16,
                        help="0: the SimCLR baseline")
    parser.add_argument("--epochs", type=positive_count, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--tau", type=float, default=1.0)
    parser.add_argument("--backbone", default="resnet18", help="a torchvision ResNet")
    parser.add_argument("--workers", type=non_negative_count, default=4,
                        help="neurve's loader workers")
    parser.add_argument("--train-limit", type=non_negative_count, default=0, metavar="N",
                        help="neurve trains on the first N training images only (with --set "
                        "train.steps_per_epoch=S for kdml): a quick check that the script "
                        "runs with the real package, not a setting for numbers")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more overrides of the kdml side only")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the results")
    return parser.parse_args(argv)


OUT_FIELDS = ("args", "rows")  # what --out holds: a file without them is not this script's


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.out is not None:  # before any training: it had been written over after a seed
        try:
            check_writable_folder(args.out.parent)
            check_json_replaceable(args.out, OUT_FIELDS)
        except KdmlError as error:
            sys.exit(f"neurve_side_by_side.py: error: --out: {error}")
    neurve = import_neurve(args.neurve)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in args.seeds:
            config = kdml_config(args, seed)
            parts = split_images(prepare_data(config.data))
            start = time.perf_counter()
            images, labels = parts["train"]
            if args.train_limit:
                images, labels = images[:args.train_limit], labels[:args.train_limit]
            net = train_neurve(neurve, args, LabelledImages(images, labels), seed,
                               Path(scratch) / f"neurve-{seed}")
            neurve_accuracy = neurve_probe(net, parts, args.charts)
            neurve_minutes = (time.perf_counter() - start) / 60
            # each side's number as soon as it is known: a device call's deadline may stop the
            # script before the table
            print(f"seed {seed}: neurve {neurve_accuracy:.3f} in {neurve_minutes:.1f} min",
                  flush=True)
            start = time.perf_counter()
            kdml_metrics = train(config, Path(scratch) / f"kdml-{seed}", progress=False,
                                 echo=lambda line: None)
            rows.append({"seed": seed, "neurve": neurve_accuracy,
                         "kdml": kdml_metrics["linear_accuracy"],
                         "neurve_minutes": neurve_minutes,
                         "kdml_minutes": (time.perf_counter() - start) / 60})
            print(f"seed {seed}: kdml {rows[-1]['kdml']:.3f} in "
                  f"{rows[-1]['kdml_minutes']:.1f} min", flush=True)
            if args.out is not None:  # the seeds so far, rewritten after each
                write_rows(args, rows)
    method = f"MSimCLR, n = {args.charts}" if args.charts else "SimCLR"
    print(f"\n{method}, d = {args.dim}, {args.dataset}, {args.epochs} epochs, tau {args.tau}, "
          f"{args.backbone} (neurve) / {config.model.backbone} (kdml); piecewise-linear "
          f"accuracy on {len(parts['test'][0]):,} held-out samples; "
          f"{machine_description(resolve_device(args.device))}\n")
    print("| seed | neurve | kdml | minutes (neurve / kdml) |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['seed']} | {row['neurve']:.3f} | {row['kdml']:.3f} | "
              f"{row['neurve_minutes']:.1f} / {row['kdml_minutes']:.1f} |")
    if len(rows) > 1:
        print(f"| mean | {statistics.mean(r['neurve'] for r in rows):.3f} | "
              f"{statistics.mean(r['kdml'] for r in rows):.3f} | |")
    return rows


def write_rows(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The seeds so far, written whole or not at all (a kill while writing keeps the last)."""
    write_json({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, args.out,
               OUT_FIELDS)


if __name__ == "__main__":
    main()
