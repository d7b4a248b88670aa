"""CUDA: deterministic runs, mixed precision and evaluation on the GPU. Skipped without one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kdml import cli
from kdml.config import resolve_config
from kdml.evaluation import retrieval_metrics
from kdml.models.backbones import build_backbone
from kdml.precision import autocast
from kdml.training.recipes import get_recipe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here; these run on a GPU machine")

RUN = ["--dataset", "digits", "--no-progress", "train.device=cuda", "train.epochs=2",
       "data.batch_size=20", "data.samples_per_class=4", "model.embedding_size=8",
       "eval.nmi=false"]


def train(tmp_path, name, *overrides):
    out = tmp_path / name
    assert cli.main(["train", "jrd", "--out", str(out), *RUN, *overrides]) == 0
    return json.loads((out / "metrics.json").read_text())


def test_deterministic_gpu_runs_repeat_bit_for_bit(tmp_path):
    first = train(tmp_path, "a", "train.deterministic=true")
    second = train(tmp_path, "b", "train.deterministic=true")
    assert first == second


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_jrd_trains_in_mixed_precision_on_the_gpu(tmp_path, precision):
    from kdml.training.loading import load_run

    final = train(tmp_path, precision, f"train.precision={precision}")["final"]
    assert 0.5 < final["recall@1"] <= 1.0
    # read on the GPU as it trained, so kdml eval gives training's scores; on the CPU in float32
    run = tmp_path / precision
    assert load_run(run).embedder.precision == precision
    assert load_run(run, device="cpu").embedder.precision == "fp32"
    assert cli.main(["eval", str(run), "--no-progress"]) == 0
    evaluated = json.loads((run / "eval.json").read_text())["metrics"]
    assert evaluated == pytest.approx(final, abs=5e-3)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_gpu_search_gives_the_cpu_metrics(metric):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(300), 4)
    embeddings = rng.standard_normal((300, 64))[labels] + rng.standard_normal((1200, 64))
    cpu = retrieval_metrics(embeddings, labels, ks=(1, 10), metric=metric, backend="faiss")
    gpu = retrieval_metrics(torch.tensor(embeddings, device="cuda"), labels, ks=(1, 10),
                            metric=metric)  # auto: torch on the GPU
    assert gpu == pytest.approx(cpu, abs=1e-6)


def test_bninception_runs_on_the_gpu():
    from kdml.models.bninception import BNInception

    net = BNInception().cuda().eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        features = net(torch.randn(2, 3, 224, 224, device="cuda"))
    assert features.shape == (2, 1024) and torch.isfinite(features).all()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("recipe_name", ["amsoftmax", "jrd", "jmmd", "intra"])
def test_a_training_step_makes_no_host_device_synchronisation(recipe_name, precision):
    """A GPU step the host must wait on loses the overlap of launching and computing: the
    forward, backward and optimizer step must queue without one."""
    recipe = get_recipe(recipe_name)
    config = resolve_config(recipe_name, recipe.params, recipe.defaults,
                            overrides=["model.embedding_size=16"])
    model = recipe.build(config, build_backbone("cnn", (3, 32, 32)), 5).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    images = torch.randn(20, 3, 32, 32, device="cuda")
    labels = torch.arange(20, device="cuda") % 5

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(images.device, precision):
            loss = model(images, labels).loss
        loss.backward()
        optimizer.step()

    step()  # the optimizer's state is created here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


CPU_RUN = ["--dataset", "digits", "--no-progress", "train.device=cpu", "train.epochs=1",
           "data.batch_size=20", "data.samples_per_class=4", "eval.nmi=false"]


def test_the_commands_that_read_a_run_run_its_model_on_the_gpu(tmp_path):
    """A run trained on the CPU, read with --device cuda: the model and its embeddings are on
    the GPU, the scores and embeddings are the CPU's (up to TF32 and summation order), and
    every file a command writes is written from the GPU's tensors."""
    from kdml.training.loading import load_run

    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--out", str(run), *CPU_RUN,
                     "model.embedding_size=8"]) == 0
    trained = load_run(run, device="cuda")
    assert trained.embedder.device.type == "cuda"
    assert next(trained.method.parameters()).is_cuda

    scores = {}
    # without TF32 convolutions (cuDNN's default), which would move the embeddings by 1e-3
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for device in ("cpu", "cuda"):
            assert cli.main(["eval", str(run), "--device", device, "--no-progress"]) == 0
            scores[device] = json.loads((run / "eval.json").read_text())["metrics"]
            assert cli.main(["embed", str(run), "--device", device, "--no-progress", "--out",
                             str(tmp_path / f"{device}.npz")]) == 0
    assert scores["cuda"] == pytest.approx(scores["cpu"], abs=5e-3)  # a near-tie may flip
    cpu, gpu = np.load(tmp_path / "cpu.npz"), np.load(tmp_path / "cuda.npz")
    np.testing.assert_allclose(gpu["embeddings"], cpu["embeddings"], rtol=1e-4, atol=1e-5)
    assert (gpu["labels"] == cpu["labels"]).all()

    index = tmp_path / "index"
    assert cli.main(["index", str(run), "--device", "cuda", "--out", str(index),
                     "--no-progress"]) == 0
    test = trained.splits.test
    np.savez(tmp_path / "q.npz", inputs=np.stack([test.load(i).numpy() for i in range(3)]))
    assert cli.main(["search", str(run), "--index", str(index), "--device", "cuda", "--query",
                     str(tmp_path / "q.npz"), "--json"]) == 0
    assert cli.main(["analyze", "generalization", str(run), "--device", "cuda", "--repeats",
                     "2", "--no-progress"]) == 0
    for picture in ("retrieval", "embedding"):
        assert cli.main(["plot", picture, str(run), "--device", "cuda", "--no-progress"]) == 0
        assert (run / "plots" / f"{picture}.png").stat().st_size > 1000


def test_an_atlas_run_s_charts_are_drawn_and_embedded_from_the_gpu(tmp_path):
    run = tmp_path / "atlas"
    assert cli.main(["train", "mtriplet", "--out", str(run), *CPU_RUN, "model.backbone=mlp",
                     "method.n_charts=3", "method.dim=2"]) == 0
    assert cli.main(["plot", "charts", str(run), "--device", "cuda", "--thumbnails", "5",
                     "--no-progress"]) == 0
    assert (run / "plots" / "charts.png").stat().st_size > 1000
    assert cli.main(["embed", str(run), "--device", "cuda", "--no-progress", "--out",
                     str(tmp_path / "codes.npz")]) == 0
    codes = np.load(tmp_path / "codes.npz")
    assert codes["chart_coords"].shape == (len(codes["labels"]), 2)
    assert set(np.unique(codes["chart_index"])) <= {0, 1, 2}


def test_the_prior_is_drawn_on_its_generator_s_device_and_moved_to_the_batch_s():
    """A CPU generator (kdml's per-step streams are CPU generators) draws the prior on the CPU
    whatever device the coordinates are on: the same draw as on a CPU run, moved to the GPU.
    Drawing it on the coordinates' device raises, or, with a CUDA generator there, draws
    other numbers than the CPU run."""
    from kdml.regularizers.manifold import ManifoldMMD

    mmd = ManifoldMMD(dim=3, n_charts=2)
    like = torch.zeros(4, 2, 3, device="cuda")
    on_gpu = mmd.sample_prior(5, like, generator=torch.Generator().manual_seed(7))
    on_cpu = mmd.sample_prior(5, like.cpu(), generator=torch.Generator().manual_seed(7))
    assert on_gpu.device.type == "cuda" and torch.equal(on_gpu.cpu(), on_cpu)


def test_compiled_gpu_steps_train_as_the_eager_ones(tmp_path):
    """train.compile=true with inductor, torch.compile's default (the CPU suite compiles the
    step with aot_eager for its time): the first step's terms are the eager step's up to
    fused float32 arithmetic, and the checkpoint keeps the method's parameter names."""
    torch._dynamo.reset()
    rows, keys = {}, {}
    for name, extra in (("eager", []), ("compiled", ["train.compile=true"])):
        out = tmp_path / name
        assert cli.main(["train", "jrd", "--out", str(out), *RUN, "train.epochs=1",
                         "train.steps_per_epoch=1", *extra]) == 0
        rows[name] = json.loads((out / "metrics.json").read_text())["epochs"][0]
        state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
        keys[name] = sorted(state["method"])
    assert keys["compiled"] == keys["eager"]
    for term in ("train/loss", "train/am_softmax", "train/regularizer"):
        assert rows["compiled"][term] == pytest.approx(rows["eager"][term], rel=1e-4), term
