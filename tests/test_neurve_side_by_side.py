"""benchmarks/neurve_side_by_side.py, run here against a stand-in for the authors' package.

neurve needs torchvision, which does not import on this CPU machine, so the real comparison runs
on a GPU machine. This checks the script's own part: the split it hands neurve (images as PIL,
labels as the dataset's), the calls it makes (as neurve's experiments/simclr.py makes them), and
the probe of neurve's codes, against a package with neurve's module and class names.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# neurve's interfaces (neurve/contrastive/{dataset,models,trainer}.py at 1ea5661), with a linear
# map in place of the ResNet; the trainer records what it was given.
STAND_IN = {
    "dataset.py": """
        import numpy as np
        import torch

        class SimCLRDataset(torch.utils.data.Dataset):
            def __init__(self, base_dataset, img_size=(32, 32), color_dist_strength=0.5):
                self.base_dataset = base_dataset

            def _tensor(self, image):
                return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255)[None]

            def __getitem__(self, index):
                image, _ = self.base_dataset[index]
                return self._tensor(image), self._tensor(image)

            def __len__(self):
                return len(self.base_dataset)
        """,
    "models.py": """
        import torch
        import torch.nn as nn

        class SimCLRMfld(nn.Module):
            def __init__(self, dim_z, n_charts, backbone="resnet50", proj_dim=128,
                         in_channels=3):
                super().__init__()
                assert (backbone, in_channels, proj_dim) == ("resnet18", 1, 64)
                self.dim_z = dim_z
                self.coords = nn.Linear(28 * 28, n_charts * dim_z)
                self.q = nn.Sequential(nn.Linear(28 * 28, n_charts), nn.Softmax(1))
                self.n_charts = n_charts

            def encode(self, x):
                flat = x.flatten(1)
                return self.q(flat), self.coords(flat).view(len(x), self.n_charts, self.dim_z)

        class SimCLR(nn.Module):
            def __init__(self, in_channels, backbone="resnet50", dim_z=2048, proj_dim=128):
                super().__init__()
                self.encoder = nn.Linear(28 * 28, dim_z)

            def encode(self, x):
                return self.encoder(x.flatten(1))
        """,
    "trainer.py": """
        from tensorboardX import SummaryWriter  # as neurve/core/trainer.py

        CALLS = []

        class SimCLRTrainer:
            def __init__(self, net, opt, tau=0.5, *args, **kwargs):
                self.net, self.loader = net, kwargs["data_loader"]
                CALLS.append(dict(kwargs, tau=tau, lr=opt.defaults["lr"],
                                  weight_decay=opt.defaults["weight_decay"]))

            def train(self, n_epochs=None, save_ckpt_freq=float("inf")):
                CALLS[-1]["n_epochs"] = n_epochs
                SummaryWriter(CALLS[-1]["out_path"]).add_scalar("train/loss", 1.0, 0)
                for view1, view2 in self.loader:
                    assert view1.shape[1:] == (1, 28, 28)
                    assert 0 <= view1.min() <= view1.max() <= 1

        class SimCLRMfldTrainer(SimCLRTrainer):
            def __init__(self, net, opt, reg_loss_weight, q_loss_weight=0, tau=0.5, *args,
                         **kwargs):
                super().__init__(net, opt, tau, *args, **kwargs)
                CALLS[-1].update(reg_loss_weight=reg_loss_weight, q_loss_weight=q_loss_weight)
        """,
}

# kdml's side (--set) on the small MLP at the images' own size: what is checked here is the
# script's part, and embedding mnist5k's 5,000 images with the CNN for kdml's probe took most of
# a run; kdml's SimCLR recipes with the CNN train in tests/test_atlas_cli.py
SMALL_KDML_NETWORK = ["model.backbone=mlp", "model.small_input=false", "method.crop_size=0"]


@pytest.fixture
def script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("neurve_side_by_side",
                                                      ROOT / "benchmarks/neurve_side_by_side.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        for name in [name for name in sys.modules if name.split(".")[0] == "neurve"]:
            del sys.modules[name]
        if not hasattr(sys.modules.get("tensorboardX"), "__file__"):  # the script's stand-in
            sys.modules.pop("tensorboardX", None)


@pytest.fixture
def stand_in(tmp_path):
    package = tmp_path / "neurve-checkout" / "neurve" / "contrastive"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    for name, source in STAND_IN.items():
        (package / name).write_text(textwrap.dedent(source))
    return package.parents[1]


def test_neurve_and_kdml_train_on_the_same_split_and_are_probed_alike(script, stand_in,
                                                                      tmp_path, capsys):
    out = tmp_path / "rows.json"
    rows = script.main(["--neurve", str(stand_in), "--dataset", "mnist5k", "--dim", "2",
                        "--charts", "4", "--epochs", "1", "--workers", "0", "--device", "cpu",
                        "--out", str(out), "--set", *SMALL_KDML_NETWORK,
                        "train.steps_per_epoch=2", "eval.nmi=false"])
    calls = sys.modules["neurve.contrastive.trainer"].CALLS
    assert calls == [{"out_path": calls[0]["out_path"], "data_loader": calls[0]["data_loader"],
                      "use_wandb": False, "tau": 1.0, "lr": 1e-4, "weight_decay": 2e-6,
                      "n_epochs": 1, "reg_loss_weight": 20, "q_loss_weight": 0.1}]
    loader = calls[0]["data_loader"]
    assert loader.batch_size == 128 and len(loader.dataset) == 4000  # mnist5k less 20% held out
    assert [row["seed"] for row in rows] == [0]
    assert 0 <= rows[0]["neurve"] <= 1 and 0 <= rows[0]["kdml"] <= 1
    assert json.loads(out.read_text())["rows"] == rows
    printed = capsys.readouterr().out
    assert "MSimCLR, n = 4, d = 2, mnist5k, 1 epochs" in printed and "1,000 held-out" in printed
    # each side's number is printed as soon as it is known, before the table
    progress = [line for line in printed.splitlines() if line.startswith("seed 0: ")]
    assert progress == [f"seed 0: neurve {rows[0]['neurve']:.3f} in "
                        f"{rows[0]['neurve_minutes']:.1f} min",
                        f"seed 0: kdml {rows[0]['kdml']:.3f} in {rows[0]['kdml_minutes']:.1f} min"]
    assert printed.index(progress[1]) < printed.index("| seed |")


def test_the_json_keeps_each_finished_seed_when_a_later_one_is_stopped(script, stand_in,
                                                                       tmp_path, monkeypatch):
    """A device call's deadline stops the script mid-run: the seeds done so far are written."""
    out = tmp_path / "rows.json"
    trained = []

    def train_until_the_deadline(*args, **kwargs):
        if trained:
            raise KeyboardInterrupt  # the deadline, during the second seed's kdml run
        trained.append(args[0].train.seed)
        return {"linear_accuracy": 0.5}

    monkeypatch.setattr(script, "train", train_until_the_deadline)
    with pytest.raises(KeyboardInterrupt):
        script.main(["--neurve", str(stand_in), "--charts", "0", "--epochs", "1", "--workers",
                     "0", "--device", "cpu", "--train-limit", "64", "--seeds", "3", "4",
                     "--out", str(out), "--set", "model.backbone=cnn",
                     "model.small_input=false", "eval.nmi=false"])
    assert [(row["seed"], row["kdml"]) for row in json.loads(out.read_text())["rows"]] == [(3, 0.5)]


def test_a_train_limit_gives_neurve_the_first_training_images_only(script, stand_in):
    script.main(["--neurve", str(stand_in), "--charts", "0", "--epochs", "1", "--workers", "0",
                 "--device", "cpu", "--train-limit", "64", "--set", *SMALL_KDML_NETWORK,
                 "train.steps_per_epoch=1", "eval.nmi=false"])
    loader = sys.modules["neurve.contrastive.trainer"].CALLS[-1]["data_loader"]
    assert len(loader.dataset) == 64


def test_the_split_hands_neurve_uint8_images_and_the_dataset_s_labels(script):
    args = script.parse_args(["--dataset", "mnist5k", "--charts", "16"])
    splits = script.prepare_data(script.kdml_config(args, seed=0).data)
    parts = script.split_images(splits)
    images, labels = parts["train"]
    assert images.dtype == torch.uint8 and images.shape == (4000, 1, 28, 28)
    # the training labels are the dataset's (kdml remaps them to 0..C-1 internally)
    assert sorted(set(labels.tolist())) == sorted(set(parts["test"][1].tolist()))
    first = script.LabelledImages(images, labels)[0]
    assert first[0].mode == "L" and np.array_equal(np.asarray(first[0]), images[0, 0].numpy())
    # where the dataset's classes are not 0..C-1 (here mnist5k's renumbered by 10), neurve
    # gets them, not kdml's remapping (on mnist5k's classes the two are the same)
    renamed = dataclasses.replace(splits, train_classes=[c + 10 for c in splits.train_classes])
    _, renamed_labels = script.split_images(renamed)["train"]
    assert np.array_equal(renamed_labels, labels + 10)


def test_the_probe_reads_the_argmax_chart_s_coordinates(script):
    class Net(torch.nn.Module):  # chart 1 carries the class; chart 0 is noise
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def encode(self, x):
            label = x[:, 0, 0, 0:1] * 255
            noise = torch.randn(len(x), 1, generator=torch.Generator().manual_seed(0))
            coords = torch.stack([torch.cat([noise, noise], 1),
                                  torch.cat([4 * label - 2, label], 1)], 1)
            return torch.tensor([[0.2, 0.8]]).expand(len(x), 2), coords

    labels = np.arange(200) % 2
    images = torch.zeros(200, 1, 28, 28, dtype=torch.uint8)
    images[:, 0, 0, 0] = torch.from_numpy(labels)
    parts = {"train": (images, labels), "test": (images, labels)}
    assert script.neurve_probe(Net(), parts, charts=2) == 1.0


def test_a_missing_checkout_is_one_line(script, tmp_path):
    with pytest.raises(SystemExit, match="not a checkout of github.com/ekorman/neurve"):
        script.main(["--neurve", str(tmp_path)])
