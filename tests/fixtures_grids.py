"""A config file of a grid of tiny amsoftmax runs on digits, as the grid tests train it."""

from __future__ import annotations

import yaml


def grid_file(tmp_path, grid: dict, data: dict | None = None, **train: object) -> list[str]:
    """`kdml train` arguments of an amsoftmax grid on digits (batches of 12, one step of one
    epoch, no NMI), into ``tmp_path / "grid"``; ``data`` and ``train`` add to its sections."""
    config = {"recipe": "amsoftmax", "grid": grid,
              "data": {"dataset": "digits", "batch_size": 12, **(data or {})},
              "train": {"epochs": 1, "steps_per_epoch": 1, "device": "cpu", **train},
              "eval": {"nmi": False}}
    for key in grid:  # the grid's values alone: a fixed value beside them is refused
        section, _, leaf = str(key).rpartition(".")
        for name in [section] if section else ["data", "train", "eval"]:
            if isinstance(config.get(name), dict):
                config[name].pop(leaf, None)
    tmp_path.mkdir(parents=True, exist_ok=True)
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump(config))
    return ["train", "--config", str(file), "--out", str(tmp_path / "grid"), "--no-progress"]


def instant_cells(monkeypatch, final: dict[str, float]) -> list:
    """Replace training by cells that 'train' at once, each writing one validation epoch of
    ``final``'s scores (as ``val/...``) and ``final`` as its result; the list returned records
    the run folders trained."""
    from kdml.training import trainer
    from kdml.training.run_folder import RunFolder

    runs: list = []

    def train(config, run_dir, resume=False, progress=None, **_):
        runs.append(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        history = [{"epoch": 1, **{f"val/{key}": value for key, value in final.items()}}]
        RunFolder(run_dir).write_metrics(history, dict(final), "validation")
        return dict(final)

    monkeypatch.setattr(trainer, "train", train)
    return runs
