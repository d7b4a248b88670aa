"""The one training loop. Recipes only assemble parts; the evaluator computes the metrics."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from kdml.config import RunConfig, load_config_file, resolve_config, save_config
from kdml.data import ArrayDataset, class_balanced_batches, class_disjoint_split, load_dataset
from kdml.data.sampling import check_batching
from kdml.errors import KdmlError
from kdml.evaluation.evaluator import evaluate_method
from kdml.models.backbones import build_backbone, freeze_batchnorm
from kdml.training.checkpoint import load_checkpoint, save_checkpoint
from kdml.training.method import Method
from kdml.training.recipes import get_recipe
from kdml.training.run_folder import RunFolder, file_logger
from kdml.viz import plot_training


@dataclass
class DataSplits:
    train: ArrayDataset  # seen classes, labels remapped to 0..C-1
    test: ArrayDataset  # unseen classes, original labels
    train_classes: list[int]  # original labels of the training classes


def prepare_data(config: RunConfig) -> DataSplits:
    """The class-disjoint split of the configured dataset."""
    dataset = load_dataset(config.data.dataset)
    train_idx, test_idx = class_disjoint_split(dataset.y, config.data.train_classes)
    train = dataset.subset(train_idx, f"{dataset.name}/train")
    classes, train.y = torch.unique(train.y, return_inverse=True)
    return DataSplits(train, dataset.subset(test_idx, f"{dataset.name}/test"), classes.tolist())


def build_method(config: RunConfig, splits: DataSplits) -> Method:
    torch.manual_seed(config.train.seed)
    backbone = build_backbone(config.model.backbone, splits.train.input_shape,
                              splits.train.default_backbone)
    return get_recipe(config.recipe).build(config, backbone, len(splits.train_classes))


@dataclass
class TrainedRun:
    run: RunFolder
    config: RunConfig
    splits: DataSplits
    method: Method
    epoch: int


def load_run(run_dir: Path) -> TrainedRun:
    """Rebuild a run's method from its config and load its last checkpoint (on the CPU)."""
    run = RunFolder.existing(run_dir)
    file_values = load_config_file(run.config)
    recipe = get_recipe(str(file_values.get("recipe")))
    config = resolve_config(recipe.name, recipe.params, file_values=file_values)
    state = load_checkpoint(run.checkpoint)
    splits = prepare_data(config)
    method = build_method(config, splits)
    try:
        method.load_state_dict(state["method"])
    except RuntimeError:
        raise KdmlError(f"checkpoint {run.checkpoint} does not match the run's config") from None
    return TrainedRun(run, config, splits, method, state["epoch"])


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise KdmlError(f"train.device={name} but no CUDA device is available; use cpu or auto")
    return torch.device(name)


def train(config: RunConfig, run_dir: Path, resume: bool = False,
          progress: bool | None = None, echo: Callable[[str], None] = print) -> dict[str, float]:
    """Train ``config`` into ``run_dir`` and return the final test metrics.

    With ``resume=True`` the run continues from ``checkpoints/last.pt``; epochs are seeded from
    (seed, epoch), so a resumed run ends where an uninterrupted one would (same seed, CPU).
    ``progress=None`` shows progress bars only on a terminal.
    """
    device = resolve_device(config.train.device)
    splits = prepare_data(config)
    check_batching(splits.train.y, config.data.samples_per_class, config.data.batch_size)
    method = build_method(config, splits).to(device)
    run = RunFolder(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    if not resume:
        save_config(config, run.config)
    log = file_logger(run.log)
    optimizer = torch.optim.Adam(method.param_groups(config.optim))
    scheduler = (torch.optim.lr_scheduler.StepLR(optimizer, config.optim.lr_step,
                                                 config.optim.lr_gamma)
                 if config.optim.lr_step else None)
    history: list[dict[str, Any]] = []
    start_epoch = 1
    if resume:
        state = load_checkpoint(run.checkpoint)
        method.load_state_dict(state["method"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state.get("scheduler"):
            scheduler.load_state_dict(state["scheduler"])
        history, start_epoch = state["history"], state["epoch"] + 1
        echo(f"resuming {run.root} after epoch {state['epoch']} of {config.train.epochs}")
    log.info("start epoch %d of %d, device %s, %d train / %d test samples", start_epoch,
             config.train.epochs, device, len(splits.train), len(splits.test))

    from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

    with SummaryWriter(str(run.tensorboard)) as writer:
        epochs = tqdm(range(start_epoch, config.train.epochs + 1), desc="epochs",
                      initial=start_epoch - 1, total=config.train.epochs, disable=_no_bar(progress))
        for epoch in epochs:
            row: dict[str, Any] = {"epoch": epoch, "lr": optimizer.param_groups[0]["lr"]}
            terms = train_one_epoch(method, optimizer, splits.train, config, epoch, device,
                                    progress)
            row.update({f"train/{name}": value for name, value in terms.items()})
            if scheduler is not None:
                scheduler.step()
            if epoch % config.train.eval_every == 0 or epoch == config.train.epochs:
                metrics = evaluate_method(method, splits.test, config.eval, device)
                row.update({f"test/{name}": value for name, value in metrics.items()})
            history.append(row)
            for key, value in row.items():
                if key != "epoch":
                    writer.add_scalar(key, value, epoch)
            log.info("epoch %d: %s", epoch, _format_row(row))
            epochs.set_postfix({k[6:]: f"{v:.3f}" for k, v in row.items()
                                if k.startswith("test/recall@1") or k == "train/loss"})
            save_checkpoint({"epoch": epoch, "method": method.state_dict(),
                             "optimizer": optimizer.state_dict(),
                             "scheduler": scheduler.state_dict() if scheduler else None,
                             "history": history, "config": config.to_dict()}, run.checkpoint)
            run.write_metrics(history, None)
            plot_training(history, run.plots)
    final = {key[5:]: value for key, value in history[-1].items() if key.startswith("test/")}
    run.write_metrics(history, final)
    log.info("final test metrics: %s", final)
    return final


def train_one_epoch(method: Method, optimizer: torch.optim.Optimizer, train_set: ArrayDataset,
                    config: RunConfig, epoch: int, device: torch.device,
                    progress: bool | None) -> dict[str, float]:
    """One pass over the training split; returns each loss term's mean over the batches."""
    _seed_epoch(config.train.seed, epoch)
    method.train()
    if config.model.freeze_bn:
        freeze_batchnorm(method)
    sums: dict[str, float] = defaultdict(float)
    batches = list(_batches(train_set, config))
    for indices in tqdm(batches, desc=f"epoch {epoch}", leave=False, disable=_no_bar(progress)):
        output = method(train_set.x[indices].to(device), train_set.y[indices].to(device))
        if not torch.isfinite(output.loss):
            raise KdmlError(f"the loss became {output.loss.item()} at epoch {epoch}; "
                            "lower the learning rates or the regularizer weight")
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        optimizer.step()
        for name, value in output.terms.items():
            sums[name] += value
    return {name: total / len(batches) for name, total in sums.items()}


def _batches(train_set: ArrayDataset, config: RunConfig) -> Iterator[torch.Tensor]:
    batch_size = config.data.batch_size
    if config.data.samples_per_class:
        for batch in class_balanced_batches(train_set.y, config.data.samples_per_class,
                                            batch_size):
            yield torch.as_tensor(batch)
    else:
        order = torch.randperm(len(train_set))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def _seed_epoch(seed: int, epoch: int) -> None:
    """Seed every generator from (seed, epoch) so an epoch is the same whether or not the run
    was interrupted before it."""
    epoch_seed = seed * 100_003 + epoch
    torch.manual_seed(epoch_seed)
    np.random.seed(epoch_seed % 2**32)  # PML's samplers draw from NumPy's global generator


def _no_bar(progress: bool | None) -> bool | None:
    return None if progress is None else not progress


def _format_row(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
                     for k, v in row.items() if k != "epoch")
