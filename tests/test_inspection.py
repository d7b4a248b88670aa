"""kdml embed, index, search and the retrieval and embedding plots, on tiny runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch
import yaml
from fixtures_array_sets import make_image_folder

from kdml import cli
from kdml.errors import KdmlError
from kdml.evaluation.knn import knn_search

# a few steps: what these commands read is a trained run's files, not how well it learnt
TINY = ["--no-progress", "train.epochs=1", "train.steps_per_epoch=5", "eval.nmi=false",
        "model.embedding_size=8", "train.device=cpu"]


def kdml(*args) -> int:
    return cli.main([str(arg) for arg in args])


def searched_sources(run: Path, tmp_path: Path, capsys, **arrays: np.ndarray) -> list[list[str]]:
    """`kdml search RUN --index tmp_path/index -k 3 --json` of a query .npz of ``arrays``: each
    query's neighbours' sources, nearest first."""
    query = tmp_path / "q.npz"
    np.savez(query, **arrays)
    capsys.readouterr()
    try:
        assert kdml("search", run, "--index", tmp_path / "index", "--query", query, "-k", "3",
                    "--json") == 0
        return [[n["source"] for n in r["neighbours"]] for r in json.loads(capsys.readouterr().out)]
    finally:
        query.unlink()


def refused_search(run: Path, tmp_path: Path, capsys, *options) -> str:
    """The error of `kdml search RUN --index tmp_path/index` of one 8-d query of ones, which
    must be refused (exit 2)."""
    np.savez(tmp_path / "q.npz", embeddings=np.ones((1, 8), dtype=np.float32))
    capsys.readouterr()
    assert kdml("search", run, "--index", tmp_path / "index", "--query", tmp_path / "q.npz",
                *options) == 2
    return capsys.readouterr().err


def damaged_index(tmp_path: Path, words: str) -> str:
    """kdml's refusal of the damaged index at tmp_path/index, for the reason ``words``."""
    return (f"kdml: error: {tmp_path / 'index'} holds a damaged index ({words}); build it again "
            "with 'kdml index'\n")


def drawn_grids(monkeypatch) -> list[dict[str, list]]:
    """Stands in for the retrieval grid's drawing (nothing is written to the run's plots/):
    each grid asked for, as its queries and neighbours (dataset positions), in order."""
    from kdml.inspection import plots

    grids: list[dict[str, list]] = []

    def grid(queries, neighbours, hits, image, path, *_, **__):
        grids.append({"queries": queries.tolist(), "neighbours": neighbours.tolist()})
        return path

    monkeypatch.setattr(plots, "plot_retrieval_grid", grid)
    return grids


def unmapped(values: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    """Stands in for the embedding map's t-SNE (a second or more a map) where a test reads
    which points are mapped, with which labels and title, not where they land."""
    return values[:, :2], "PCA"


def lengthened_embeddings(*args):
    """embed_dataset's embeddings, each lengthened by its own power of two (exact): what the
    cosine metric ignores."""
    from kdml.evaluation.evaluator import embed_dataset

    embedded = embed_dataset(*args)
    factors = 2.0 ** (embedded.indices % 5).to(embedded.values.dtype)
    return embedded._replace(values=embedded.values * factors[:, None].to(
        embedded.values.device))


def folder_with_unreadable_test_images(tmp_path: Path) -> Path:
    """A folder: dataset of 4 classes of 4 images, and in each test class (c02, c03) two
    files that are no image (data.on_bad_image=skip leaves them out)."""
    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=32)
    for name in ("c02", "c03"):
        for index in range(2):
            (folder / name / f"a_bad{index}.jpg").write_bytes(b"not a jpeg at all")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    assert kdml("train", "amsoftmax", "--dataset", "digits", "--out", root / "plain", *TINY) == 0
    # a whole epoch: after a few steps nearly every test digit sits in one chart, and a search
    # that ignored the charts would pass the chart tests
    assert kdml("train", "mtriplet", "--dataset", "digits", "--out", root / "atlas", *TINY,
                "train.steps_per_epoch=0", "method.n_charts=3", "data.batch_size=20",
                "data.samples_per_class=4") == 0
    return root


@pytest.fixture(scope="module")
def built(runs, tmp_path_factory) -> Path:
    """What most search tests start from, made once: `kdml index` of each run (plain-index,
    atlas-index) and `kdml embed` of its test part (plain.npz, atlas.npz). Tests copy them
    into their own folder, where they change them and where their messages name them."""
    root = tmp_path_factory.mktemp("built")
    for name in ("plain", "atlas"):
        assert kdml("index", runs / name, "--out", root / f"{name}-index") == 0
        assert kdml("embed", runs / name, "--out", root / f"{name}.npz") == 0
    return root


def test_embed_writes_embeddings_labels_and_sources(runs, tmp_path, capsys):
    out = tmp_path / "test.npz"
    assert kdml("embed", runs / "plain", "--out", out) == 0
    arrays = np.load(out)
    assert arrays["embeddings"].shape == (896, 8) and arrays["labels"].min() == 5
    assert arrays["positions"].tolist() == list(range(896))
    assert arrays["sources"][3] == "digits/test[3]"
    train = tmp_path / "train.npz"
    assert kdml("embed", runs / "plain", "--split", "train", "--out", train) == 0
    assert set(np.load(train)["labels"].tolist()) == {0, 1, 2, 3, 4}  # the dataset's labels
    capsys.readouterr()
    assert kdml("embed", runs / "plain", "--out", out) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err
    assert kdml("embed", runs / "atlas", "--out", tmp_path / "atlas.npz") == 0
    atlas = np.load(tmp_path / "atlas.npz")
    assert atlas["chart_coords"].shape == (896, 2) and atlas["chart_index"].max() <= 2


@pytest.mark.parametrize("kind", ["exact", "ivf", "hnsw"])
def test_index_and_search_find_the_nearest_test_samples(runs, tmp_path, capsys, kind):
    index = tmp_path / "index"
    assert kdml("index", runs / "plain", "--out", index, "--kind", kind) == 0
    assert json.loads((index / "index.json").read_text())["kind"] == kind
    assert kdml("embed", runs / "plain", "--out", tmp_path / "test.npz") == 0
    embeddings = np.load(tmp_path / "test.npz")["embeddings"]
    np.savez(tmp_path / "query.npz", embeddings=embeddings[:32])
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", index, "--query", tmp_path / "query.npz",
                "-k", "5", "--json") == 0
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 32 and all(len(r["neighbours"]) == 5 for r in results)
    exact = np.concatenate([c.indices for c in knn_search(embeddings[:32], embeddings, k=5)])
    found = [[int(item["source"].split("[")[1][:-1]) for item in r["neighbours"]]
             for r in results]
    if kind == "exact":
        assert found == exact.tolist()
    else:  # approximate indexes: the query itself, and most exact neighbours, are found
        assert all(row[0] == query for query, row in enumerate(found))
        overlap = np.mean([len(set(row) & set(true)) / 5
                           for row, true in zip(found, exact.tolist(), strict=True)])
        assert overlap >= 0.9


def test_atlas_index_searches_the_query_chart_only(runs, built, tmp_path, capsys):
    index = tmp_path / "index"
    shutil.copytree(built / "atlas-index", index)
    shutil.copy(built / "atlas.npz", tmp_path / "codes.npz")
    codes = np.load(tmp_path / "codes.npz")
    charted = {"chart_coords": codes["chart_coords"][:4], "chart_index": codes["chart_index"][:4]}
    np.savez(tmp_path / "query.npz", embeddings=codes["embeddings"][:4], **charted)
    np.savez(tmp_path / "charts-only.npz", **charted)  # what the search uses: no embeddings
    results = []
    for query_file in ("query.npz", "charts-only.npz"):
        capsys.readouterr()
        assert kdml("search", runs / "atlas", "--index", index, "--query", tmp_path / query_file,
                    "-k", "3", "--json") == 0
        results.append([[item["source"] for item in result["neighbours"]]
                        for result in json.loads(capsys.readouterr().out)])
    assert results[0] == results[1]
    assert len(set(codes["chart_index"][:4].tolist())) > 1  # the queries are in several charts
    for query, neighbours in enumerate(results[0]):
        charts = {int(codes["chart_index"][int(source.split("[")[1][:-1])])
                  for source in neighbours}
        assert charts == {int(codes["chart_index"][query])}


def test_raw_queries_of_an_atlas_run_are_searched_in_their_own_charts(runs, built, tmp_path,
                                                                     capsys):
    """An .npz of raw inputs is embedded by the run's model into chart codes and each query
    searched in its own chart, as the chart codes the model gives it directly are; and with a
    -k beyond every chart's size, each query lists its chart's other items once, ranked from
    1, never a missing neighbour (faiss's -1) as the last item of the index."""
    from kdml.data.offline import load_digits
    from kdml.training.loading import load_run

    images = load_digits()[0][:60]
    trained = load_run(runs / "atlas")
    trained.method.eval()
    with torch.no_grad():
        coords, charts = trained.method.chart_codes(trained.embedder.transform(images))
    assert len(set(charts.tolist())) > 1  # queries in several charts
    np.savez(tmp_path / "raw.npz", inputs=images.numpy())
    np.savez(tmp_path / "codes.npz", chart_coords=coords.numpy(),
             chart_index=charts.numpy())
    shutil.copytree(built / "atlas-index", tmp_path / "index")
    indexed_charts = np.load(tmp_path / "index" / "items.npz")["chart"]
    found = []
    for query, k in (("raw.npz", 3), ("codes.npz", 3), ("raw.npz", 1000)):
        capsys.readouterr()
        assert kdml("search", runs / "atlas", "--index", tmp_path / "index", "--query",
                    tmp_path / query, "-k", k, "--json") == 0
        found.append(json.loads(capsys.readouterr().out))
    sources = [[[n["source"] for n in r["neighbours"]] for r in result] for result in found]
    assert sources[0] == sources[1]
    positions = {str(source): position for position, source in enumerate(
        np.load(tmp_path / "index" / "items.npz")["sources"])}
    for chart, result in zip(charts.tolist(), found[2], strict=True):
        listed = [positions[n["source"]] for n in result["neighbours"]]
        assert sorted(listed) == np.flatnonzero(indexed_charts == chart).tolist()
        assert [n["rank"] for n in result["neighbours"]] == list(range(1, len(listed) + 1))


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory) -> tuple[Path, Path]:
    """A folder: dataset of 4 classes of 4 images (c00, c01 train, c02, c03 test), and an
    amsoftmax run trained on it (tests that change the run work on a copy)."""
    root = tmp_path_factory.mktemp("folder")
    folder = make_image_folder(root, classes=4, per_class=4, size=32)
    run = root / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", run, *TINY,
                "data.batch_size=4", "data.resize=36", "data.image_size=32",
                "eval.ks=[1,2]") == 0
    return folder, run


def test_queries_of_raw_inputs_and_images(folder_run, tmp_path, capsys, monkeypatch):
    folder, run = folder_run[0], tmp_path / "run"
    shutil.copytree(folder_run[1], run)  # the plots are drawn into it
    assert kdml("index", run, "--out", tmp_path / "index") == 0
    image = sorted((folder / "c03").iterdir())[0]
    capsys.readouterr()
    assert kdml("search", run, "--index", tmp_path / "index", "--query", image, "-k", "2") == 0
    printed = capsys.readouterr().out
    assert f"query {image.name}:" in printed and "c03" in printed
    assert "  label  class  source" in printed  # the folders name the classes
    assert kdml("search", run, "--index", tmp_path / "index", "--query", image, "-k", "8",
                "--json") == 0
    neighbours = json.loads(capsys.readouterr().out)[0]["neighbours"]
    assert {item["label"] for item in neighbours} == {2, 3}  # the unseen classes c02 and c03
    for item in neighbours:
        assert item["class_name"] == f"c{item['label']:02d}" == Path(item["source"]).parent.name
    assert kdml("embed", run, "--split", "train", "--out", tmp_path / "train.npz") == 0
    train = np.load(tmp_path / "train.npz")
    assert set(train["labels"].tolist()) == {0, 1}
    assert [f"c{label:02d}" for label in train["labels"]] == train["class_names"].tolist()
    # The pictures caption the classes by name too.
    from kdml.inspection import plots

    drawn = {}

    def grid(queries, neighbours, hits, image, path, titles, gallery=None):
        assert gallery is None  # a folder's test part has no gallery: queries among themselves
        drawn["titles"] = {titles(int(p)) for p in [*queries, *neighbours.ravel()]}
        # a hit is a neighbour of the query's class (the names here are the classes), and a
        # query is never its own neighbour
        for query, row, marks in zip(queries, neighbours, hits, strict=True):
            assert int(query) not in row.tolist()
            assert marks.tolist() == [titles(int(p)) == titles(int(query)) for p in row]
        drawn["hits"] = int(hits.sum())
        return path

    def embedding_map(coordinates, labels, path, method, title, class_names, *_):
        drawn["legend"] = {int(label): class_names[int(label)] for label in set(labels)}
        return path

    monkeypatch.setattr(plots, "plot_retrieval_grid", grid)
    monkeypatch.setattr(plots, "embedding_map", unmapped)
    monkeypatch.setattr(plots, "plot_embedding_map", embedding_map)
    # every test image; 5 neighbours, of which at most 3 share the query's class
    assert kdml("plot", "retrieval", run, "--queries", "8", "-k", "5") == 0
    assert kdml("plot", "embedding", run) == 0
    hits = drawn.pop("hits")
    assert 0 < hits <= 8 * 3  # hits and misses both: the check in grid saw each kind
    assert drawn == {"titles": {"c02", "c03"}, "legend": {2: "c02", 3: "c03"}}
    np.savez(tmp_path / "raw.npz", inputs=np.zeros((2, 3, 36, 36), dtype=np.uint8))
    assert kdml("search", run, "--index", tmp_path / "index", "--query",
                tmp_path / "raw.npz") == 0
    np.savez(tmp_path / "bad.npz", inputs=np.zeros((2, 3, 20, 20), dtype=np.uint8))
    capsys.readouterr()
    assert kdml("search", run, "--index", tmp_path / "index", "--query",
                tmp_path / "bad.npz") == 2
    assert capsys.readouterr().err == (
        "kdml: error: query inputs have shape (3, 20, 20) per sample but the run's samples are "
        "(3, 36, 36): give 'inputs' as [Q, 3, 36, 36], one query as [1, 3, 36, 36]\n")


def test_train_split_is_embedded_with_the_datasets_labels_and_names(tmp_path, capsys):
    """CUB's class ids start at 1: `--split train` maps the training split's 0..C-1 back to the
    dataset's ids, each with its own class name (digits and folders start at 0, where a missing
    mapping would go unnoticed)."""
    from fixtures_photo_sets import make_cub

    from kdml.data.formats.cub import folder_class_name

    root = make_cub(tmp_path / "cub", classes=4, per_class=4)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "cub", "--data-root", root, "--out", run,
                *TINY, "data.batch_size=4", "data.resize=36", "data.image_size=32",
                "eval.ks=[1,2]") == 0
    assert kdml("embed", run, "--split", "train", "--out", tmp_path / "train.npz") == 0
    train = np.load(tmp_path / "train.npz")
    assert sorted(set(train["labels"].tolist())) == [1, 2]
    for label, name, source in zip(train["labels"], train["class_names"], train["sources"],
                                   strict=True):
        folder = Path(str(source)).parent.name  # NNN.Name: the image's class id and name
        assert int(folder.split(".")[0]) == label and name == folder_class_name(folder)


@pytest.fixture(scope="module")
def pca_run(tmp_path_factory) -> Path:
    """A DDML run on mnist5k->digits reduced to 20-d by data.pca_dim, with an index."""
    run = tmp_path_factory.mktemp("pca") / "run"
    assert kdml("train", "ddml", "--dataset", "mnist5k->digits", "--out", run, *TINY,
                "data.pca_dim=20") == 0
    assert kdml("index", run, "--out", run.parent / "index") == 0
    return run


def test_another_pair_goes_through_the_pca_of_the_run(pca_run, tmp_path, capsys):
    """data.pca_dim's PCA had been fitted again on the other pair's source: the model got its
    inputs in a basis it never saw (Recall@1 0.81 -> 0.75 on the same target samples), and
    then such runs were refused another dataset. Another pair now goes through the run's own
    PCA: digits as the source of digits->mnist5k embed exactly as the run's own target."""
    own, other = tmp_path / "own.npz", tmp_path / "other.npz"
    assert kdml("embed", pca_run, "--out", own) == 0
    assert kdml("embed", pca_run, "--dataset", "digits->mnist5k", "--split", "train",
                "--out", other) == 0
    own_arrays, other_arrays = np.load(own), np.load(other)
    assert list(own_arrays["sources"]) == list(other_arrays["sources"])
    np.testing.assert_array_equal(own_arrays["embeddings"], other_arrays["embeddings"])
    assert kdml("eval", pca_run, "--dataset", "digits->mnist5k") == 0
    capsys.readouterr()
    assert kdml("eval", pca_run, "--dataset", "fashion-mnist") == 2
    assert capsys.readouterr().err == (
        "kdml: error: the run's inputs are its domain pair's features projected by a PCA "
        "(data.pca_dim=20): --dataset must be a domain pair of those features (SOURCE->TARGET "
        "or npz:FILE), got fashion-mnist\n")


def test_another_pair_of_other_features_is_refused_by_the_pca_of_the_run(pca_run, tmp_path,
                                                                        capsys):
    """A feature file whose features are not the run's (32 against 64) is refused in one
    line naming both sizes, before anything is embedded."""
    features = tmp_path / "f.npz"
    generator = np.random.default_rng(0)
    np.savez(features, X=generator.random((40, 32)), y=np.arange(40) % 4,
             domain=np.array(["source", "target"] * 20))
    capsys.readouterr()
    assert kdml("embed", pca_run, "--dataset", f"npz:{features}", "--out",
                tmp_path / "e.npz") == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: f has 32 features a sample, but the PCA (fitted on the "
                          "trained run's source) takes 64") and err.count("\n") == 1, err
    assert not (tmp_path / "e.npz").exists()


def test_raw_queries_of_a_pca_run_go_through_its_pca(pca_run, tmp_path, capsys):
    """A domain pair reduced by data.pca_dim takes raw 'inputs' queries as the pair's features
    and projects them by the run's PCA (kept in its checkpoint): target samples find
    themselves. They had been refused unless already in a basis the run does not keep."""
    from kdml.data.domains import load_domain_data

    target = load_domain_data("mnist5k->digits").target.x
    shutil.copytree(pca_run.parent / "index", tmp_path / "index")
    rows = [5, 700, 1796]
    sources = searched_sources(pca_run, tmp_path, capsys, inputs=target[rows].numpy())
    assert [found[0] for found in sources] == [f"digits[{row}]" for row in rows]
    np.savez(tmp_path / "q.npz", inputs=np.zeros((1, 20), dtype=np.float32))
    assert kdml("search", pca_run, "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz") == 2
    assert capsys.readouterr().err == (
        "kdml: error: query inputs have shape (20,) per sample but the run's are its domain "
        "pair's features, (64,) each, which kdml projects by the run's PCA (data.pca_dim=20): "
        "give them before the PCA\n")


def test_a_pca_run_s_own_pair_goes_through_the_pca_of_its_checkpoint(tmp_path):
    """A run's own pair, its source edited since and its data.json deleted (as the refusal of
    other data says, to use it anyway), had been projected by a PCA fitted again on the new
    source: a basis the model never saw, which changed even the unchanged target's embeddings
    (Recall@1 0.83 -> 0.77 on a 10-d pair), while --dataset of the same file took the run's
    own PCA. kdml eval, embed and --resume now take the checkpoint's PCA."""
    rng = np.random.default_rng(0)
    truth = np.tile(np.arange(4), 30)
    x = rng.standard_normal((120, 12))
    x[np.arange(120), truth] += 6
    domain = np.where(np.arange(120) < 60, "source", "target")
    pair = tmp_path / "pair.npz"
    np.savez(pair, X=x, y=truth, domain=domain)
    run = tmp_path / "run"
    assert kdml("train", "ddml", "--dataset", f"npz:{pair}", "--out", run, *TINY,
                "data.pca_dim=6", "data.batch_size=16", "eval.ks=[1]", "method.k1=3",
                "method.k2=8") == 0
    trained = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["input_pca"]
    assert kdml("embed", run, "--out", tmp_path / "before.npz") == 0
    rotation = np.linalg.qr(rng.standard_normal((12, 12)))[0]
    x[:60] = x[:60] @ rotation  # the source edited; the target as it was
    np.savez(pair, X=x, y=truth, domain=domain)
    (run / "data.json").unlink()
    assert kdml("embed", run, "--out", tmp_path / "after.npz") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "before.npz")["embeddings"],
                                  np.load(tmp_path / "after.npz")["embeddings"])
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["epochs"] = 2
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert kdml("train", "--resume", run, "--no-progress") == 0
    resumed = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["input_pca"]
    assert all(torch.equal(resumed[key], trained[key]) for key in ("mean", "components"))


def test_a_pca_run_keeps_its_pca_so_its_model_needs_no_data(tmp_path, capsys):
    """A data.pca_dim run keeps its PCA in its checkpoints: with its npz: features moved away,
    raw queries still go through it (they had needed the run's data, to fit it again) and
    another pair of those features embeds as the run's own did. A checkpoint of a kdml before
    the PCA was kept is still loaded with the run's data; a damaged one is refused in one
    line."""
    rng = np.random.default_rng(0)
    truth = np.tile(np.arange(4), 30)
    x = rng.standard_normal((120, 12))
    x[np.arange(120), truth] += 6
    domain = np.where(np.arange(120) < 60, "source", "target")
    np.savez(tmp_path / "pair.npz", X=x, y=truth, domain=domain)
    run = tmp_path / "run"
    assert kdml("train", "ddml", "--dataset", f"npz:{tmp_path / 'pair.npz'}", "--out", run,
                *TINY, "data.pca_dim=6", "data.batch_size=16", "eval.ks=[1]", "method.k1=3",
                "method.k2=8") == 0
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["input_pca"]["components"].shape == (6, 12)
    assert kdml("embed", run, "--out", tmp_path / "own.npz") == 0
    assert kdml("index", run, "--out", tmp_path / "index") == 0
    (tmp_path / "pair.npz").rename(tmp_path / "moved.npz")  # the run's data is gone
    rows = [60, 75, 119]
    sources = searched_sources(run, tmp_path, capsys, inputs=x[rows].astype(np.float32))
    assert [found[0] for found in sources] == [f"pair/target[{row - 60}]" for row in rows]
    assert kdml("embed", run, "--dataset", f"npz:{tmp_path / 'moved.npz'}", "--out",
                tmp_path / "other.npz") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "own.npz")["embeddings"],
                                  np.load(tmp_path / "other.npz")["embeddings"])
    del state["input_pca"]  # as an older kdml wrote it: the PCA is fitted again on the data
    torch.save(state, run / "checkpoints" / "last.pt")
    capsys.readouterr()
    assert kdml("embed", run, "--dataset", f"npz:{tmp_path / 'moved.npz'}", "--out",
                tmp_path / "old.npz") == 2
    assert "pair.npz, whose file does not exist now" in capsys.readouterr().err
    (tmp_path / "moved.npz").rename(tmp_path / "pair.npz")
    assert kdml("embed", run, "--dataset", f"npz:{tmp_path / 'pair.npz'}", "--out",
                tmp_path / "old.npz") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "own.npz")["embeddings"],
                                  np.load(tmp_path / "old.npz")["embeddings"])
    state["input_pca"] = {"mean": torch.zeros(12, dtype=torch.float64),
                          "components": torch.full((6, 12), float("nan"), dtype=torch.float64)}
    torch.save(state, run / "checkpoints" / "last.pt")
    capsys.readouterr()
    assert kdml("embed", run, "--dataset", f"npz:{tmp_path / 'pair.npz'}", "--out",
                tmp_path / "damaged.npz") == 2
    assert capsys.readouterr().err == (
        f"kdml: error: checkpoint {run / 'checkpoints' / 'last.pt'} is damaged: its input PCA "
        "is not the finite float64 mean [D] and components [dim, D] kdml writes; delete it and "
        "train again\n")


def test_eval_scores_another_dataset_with_the_runs_model(folder_run, tmp_path, capsys):
    """``kdml eval RUN --dataset D`` scores D's test part (the run's data.split of it) and
    writes nothing: on the run's own data it prints what ``kdml eval`` prints, and on another
    folder its Recall@1 is a literal leave-one-out loop over that folder's embeddings."""
    folder, run = folder_run[0], tmp_path / "run"
    shutil.copytree(folder_run[1], run)  # its eval.json is deleted

    def scores(printed: str) -> list[str]:
        return [line for line in printed.splitlines() if line.startswith("  recall@")]

    capsys.readouterr()
    assert kdml("eval", run) == 0
    own = scores(capsys.readouterr().out)
    (run / "eval.json").unlink()
    assert kdml("eval", run, "--dataset", f"folder:{folder}") == 0
    assert scores(capsys.readouterr().out) == own and len(own) == 2
    assert not (run / "eval.json").exists()

    second = make_image_folder(tmp_path / "second", classes=6, per_class=5, size=32, seed=7)
    assert kdml("eval", run, "--dataset", f"folder:{second}") == 0
    printed = capsys.readouterr().out
    # the run may have trained on another dataset's classes: "not seen in training" is not said
    assert ("test set: 15 samples of the classes of its test part (as the run's data.split "
            "divides it)\n") in printed and f"(amsoftmax, folder:{second})" in printed
    assert kdml("embed", run, "--dataset", f"folder:{second}", "--out", tmp_path / "e.npz") == 0
    arrays = np.load(tmp_path / "e.npz")
    vectors, labels = arrays["embeddings"].astype(np.float64), arrays["labels"].tolist()
    hits = 0
    for i in range(len(labels)):
        best, nearest = -2.0, -1
        for j in range(len(labels)):
            if j != i:
                cosine = float(vectors[i] @ vectors[j] / np.linalg.norm(vectors[i])
                               / np.linalg.norm(vectors[j]))
                if cosine > best:
                    best, nearest = cosine, j
        hits += labels[nearest] == labels[i]
    assert scores(printed)[0].split() == ["recall@1", f"{hits / len(labels):.4f}"]

    capsys.readouterr()
    for command in ("eval", "embed", "index"):  # embed and index had taken it silently
        out = {"eval": [], "embed": ["--out", tmp_path / "e-test.npz"],
               "index": ["--out", tmp_path / "index-test"]}[command]
        assert kdml(command, run, "--dataset", f"folder:{second}", "--test", *out) == 2
        assert capsys.readouterr().err.endswith("own parts are read anyway: drop --test\n")
    assert kdml("index", run, "--dataset", "digits", "--split", "train", "--test",
                "--out", tmp_path / "i") == 2
    assert capsys.readouterr().err.endswith("own parts are read anyway: drop --test\n")
    assert kdml("eval", run, "--dataset", "digits") == 2
    assert "give a dataset shaped like the run's" in capsys.readouterr().err
    # two classes, split in halves: one test class would score 1 everywhere (training refuses it)
    pair = make_image_folder(tmp_path / "pair", classes=2, per_class=6, size=32, seed=3)
    assert kdml("eval", run, "--dataset", f"folder:{pair}") == 2
    err = capsys.readouterr().err  # not "data.train_classes, or more classes": eval sets none
    assert "has the same class" in err and err.endswith(
        "trivially 1; the run's split settings (data.split, data.train_classes) chose it: give "
        "--dataset a dataset of more classes, each with two samples or more\n")
    # a dataset's own split chose its gallery: the run's split settings had been named too
    from fixtures_array_sets import make_csv_list

    own = make_csv_list(tmp_path / "own", classes=2, per_class=6, size=32, query_gallery=True)
    assert kdml("eval", run, "--dataset", f"csv:{own}") == 2
    assert capsys.readouterr().err.endswith(
        "trivially 1; the dataset's own split chose it: give --dataset one whose gallery holds "
        "at least 2 classes\n")


def test_eval_on_a_dataset_a_runs_class_count_does_not_fit_says_what_to_give(tmp_path, capsys):
    """A run trained with data.train_classes a count (2 of 4 classes) keeps that count on
    another dataset: on one of 2 classes nothing is left to score, which had been refused as
    "train_classes=2.0 leaves 2 of 2 classes for training", advice kdml eval cannot follow."""
    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=32)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", run, *TINY,
                "data.batch_size=4", "data.resize=36", "data.image_size=32",
                "data.train_classes=2", "eval.ks=[1]") == 0
    pair = make_image_folder(tmp_path / "pair", classes=2, per_class=4, size=32, seed=3)
    capsys.readouterr()
    for command in ("eval", "embed"):
        extra = ["--out", tmp_path / "e.npz"] if command == "embed" else []
        assert kdml(command, run, "--dataset", f"folder:{pair}", *extra) == 2
        assert capsys.readouterr().err == (
            f"kdml: error: --dataset folder:{pair} has 2 classes, but the run's "
            "data.train_classes=2 keeps 2 of them as its training classes and scores the rest: "
            "give a dataset of more than 2 classes\n")


def test_eval_ks_sets_the_recall_ks_it_scores(tmp_path, capsys):
    """A run's eval.ks beyond another dataset's references had been refused with "lower
    eval.ks", which kdml eval could not set: --ks sets them, for the run's own data too."""
    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=32)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", run, *TINY,
                "data.batch_size=4", "data.resize=36", "data.image_size=32",
                "eval.ks=[1,2,4]") == 0
    small = make_image_folder(tmp_path / "small", classes=4, per_class=2, size=32, seed=5)
    capsys.readouterr()
    assert kdml("eval", run, "--dataset", f"folder:{small}") == 2  # 4 test samples: 3 refs
    assert capsys.readouterr().err == (
        "kdml: error: the run's eval.ks asks for Recall@4 but a test query has only 3 "
        "references; give --ks, e.g. '--ks 1 2'\n")
    assert kdml("eval", run, "--dataset", f"folder:{small}", "--ks", "1", "2") == 0
    printed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
               if line.startswith("  recall@")]
    assert printed == ["recall@1", "recall@2"]

    assert kdml("eval", run) == 0
    own = [line.split() for line in capsys.readouterr().out.splitlines()
           if line.startswith("  recall@")]
    assert kdml("eval", run, "--ks", "2", "8") == 2  # 8 test samples of the run: 7 refs
    assert capsys.readouterr().err.rstrip().endswith("lower --ks, e.g. '--ks 2'")
    assert kdml("eval", run, "--ks", "2") == 0
    assert [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("  recall@")] == [own[1]]
    # config.yaml's eval section may be edited (kdml eval takes it): checked as --ks is, not
    # left to the scorer's "K=16 in ks is larger than the 7 available references"
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("  - 4\n", "  - 16\n"))
    assert kdml("eval", run) == 2
    assert capsys.readouterr().err == (
        "kdml: error: the run's eval.ks asks for Recall@16 but a test query has only 7 "
        "references; give --ks, e.g. '--ks 1 2'\n")
    metrics = json.loads((run / "eval.json").read_text())["metrics"]
    assert [name for name in metrics if name.startswith("recall@")] == ["recall@2"]
    assert kdml("eval", run, "--ks", "2", "1", "2") == 0  # in order, each once
    assert [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("  recall@")] == own[:2]
    assert kdml("eval", run, "--ks", "0") == 2
    assert "--ks" in capsys.readouterr().err


def test_eval_ks_of_a_run_that_kept_its_best_epoch(tmp_path, capsys):
    """kdml eval scores, it selects no epoch: --ks without the run's select_metric's K (its
    Recall@1) is no reason to refuse."""
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "digits", "--out", run, *TINY,
                "data.validation=0.5", "train.keep_best=true") == 0
    capsys.readouterr()
    assert kdml("eval", run, "--best", "--ks", "2") == 0, capsys.readouterr().err
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()
            if line.startswith("  recall@")] == ["recall@2"]
    written = json.loads((run / "eval-best.json").read_text())
    assert (written["checkpoint"], written["scored"]) == ("best", "validation")


def test_image_queries_of_an_in_memory_image_run(runs, built, tmp_path, capsys):
    """A PNG of a digits sample finds what the same sample as raw inputs finds, in grey or
    RGB; an image of another size and mode is fitted to the samples' 1x8x8 grey."""
    from PIL import Image

    from kdml.data.offline import load_digits

    images, _ = load_digits()
    sample = images[1000].numpy()  # [1, 8, 8] in [0, 1]
    np.savez(tmp_path / "raw.npz", inputs=sample[None])
    pixels = np.round(sample[0] * 255).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "grey.png")
    Image.fromarray(np.stack([pixels] * 3, -1)).save(tmp_path / "rgb.png")
    Image.new("RGB", (40, 24), (90, 30, 200)).save(tmp_path / "wide.jpg")
    shutil.copytree(built / "plain-index", tmp_path / "index")
    found = {}
    for name in ("raw.npz", "grey.png", "rgb.png", "wide.jpg"):
        capsys.readouterr()
        assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                    tmp_path / name, "-k", "3", "--json") == 0
        found[name] = json.loads(capsys.readouterr().out)[0]["neighbours"]
    assert len(found["wide.jpg"]) == 3  # fitted to 8x8: centre-cropped, resized
    for name in ("grey.png", "rgb.png"):
        assert [n["source"] for n in found[name]] == [n["source"] for n in found["raw.npz"]]
        assert np.allclose([n["score"] for n in found[name]],
                           [n["score"] for n in found["raw.npz"]], atol=0.02)


def test_an_unreadable_query_image_says_what_to_give_instead(runs, built, tmp_path, capsys):
    """An empty or cut-off image file as the query: one line naming it, why, and the remedy."""
    shutil.copytree(built / "plain-index", tmp_path / "index")
    (tmp_path / "empty.jpg").write_bytes(b"")
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                tmp_path / "empty.jpg") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: cannot decode image {tmp_path / 'empty.jpg'}")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "give a readable image file or an .npz" in err


def test_mismatched_index_and_query_are_refused(runs, built, tmp_path, capsys):
    shutil.copytree(built / "atlas-index", tmp_path / "atlas-index")
    np.savez(tmp_path / "query.npz", embeddings=np.zeros((1, 8), dtype=np.float32))
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "atlas-index", "--query",
                tmp_path / "query.npz") == 2
    assert capsys.readouterr().err == (  # another run's, not "another checkpoint of this run"
        f"kdml: error: index {tmp_path / 'atlas-index'} was built from another checkpoint "
        f"({(runs / 'atlas').resolve()}); build it from this run with 'kdml index "
        f"{runs / 'plain'} --out DIR'\n")
    shutil.copytree(built / "plain-index", tmp_path / "plain-index")
    np.savez(tmp_path / "wide.npz", embeddings=np.zeros((1, 5), dtype=np.float32))
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "plain-index", "--query",
                tmp_path / "wide.npz") == 2
    err = capsys.readouterr().err
    assert "dimension 5" in err and err.count("\n") == 1


def test_a_retrieval_grid_is_at_most_64_a_side(runs, capsys):
    for option in ("--queries", "-k"):
        assert kdml("plot", "retrieval", runs / "plain", option, "65") == 2
        assert "must be from 1 to 64, got 65" in capsys.readouterr().err


def test_plots_of_retrieval_and_of_the_embedding(runs, capsys):
    assert kdml("plot", "retrieval", runs / "plain", "--queries", "3", "-k", "4") == 0
    # a t-SNE map of 60 points: what is checked is that both pictures are drawn
    assert kdml("plot", "embedding", runs / "plain", "--max-points", "60") == 0
    for name in ("retrieval.png", "embedding.png"):
        path = runs / "plain" / "plots" / name
        assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_map_of_a_cosine_run_is_of_its_directions(runs, tmp_path, monkeypatch):
    """The map had drawn the raw embeddings: points the cosine metric takes for one (the same
    direction) sat apart by their lengths."""
    from kdml.inspection import plots

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    assert yaml.safe_load((run / "config.yaml").read_text())["eval"]["metric"] == "cosine"
    mapped = {}

    def map_of(values, seed=0):
        mapped["values"] = values
        return values[:, :2], "t-SNE"

    def scatter(coordinates, labels, path, method, title, class_names=None, *_):
        mapped.update(method=method, labels=labels)
        return path

    monkeypatch.setattr(plots, "embedding_map", map_of)
    monkeypatch.setattr(plots, "plot_embedding_map", scatter)
    assert kdml("plot", "embedding", run, "--max-points", "300") == 0
    norms = np.linalg.norm(mapped["values"].astype(np.float64), axis=1)
    assert len(norms) == 300 and np.allclose(norms, 1.0, atol=1e-6)
    assert mapped["method"] == "t-SNE, of the L2-normalised embeddings (cosine metric)"
    # the 300 are a random sample of the test part (seed 0), not its first 300 rows
    assert kdml("embed", run, "--out", tmp_path / "test.npz") == 0
    embedded = np.load(tmp_path / "test.npz")
    keep = np.random.default_rng(0).choice(896, 300, replace=False)
    directions = embedded["embeddings"][keep].astype(np.float64)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    assert np.allclose(mapped["values"], directions, atol=1e-5)
    assert mapped["labels"].tolist() == embedded["labels"][keep].tolist()


def test_a_map_of_a_random_sample_says_so_with_the_whole_part_s_counts(runs, tmp_path,
                                                                       monkeypatch):
    """--max-points below the test part's size draws a random sample: the title had said
    neither that nor how many of how many points, and counted the drawn points' classes
    only ("3 classes" for 3 points of a 5-class part). Without sampling it is as before."""
    from kdml import viz_retrieval
    from kdml.inspection import plots

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    monkeypatch.setattr(plots, "embedding_map", unmapped)
    titles = []
    figure_of = viz_retrieval._embedding_map_figure

    def figure(*args: object) -> object:
        drawn = figure_of(*args)  # type: ignore[arg-type]
        titles.append(" ".join(drawn.axes[0].get_title().split()))
        return drawn

    monkeypatch.setattr(viz_retrieval, "_embedding_map_figure", figure)
    for points in ("3", "300", "896"):
        assert kdml("plot", "embedding", run, "--max-points", points) == 0
        (run / "plots" / "embedding.png").unlink()
    # the digits test part: 896 images of classes 5-9
    method = "amsoftmax on digits (PCA, of the L2-normalised embeddings (cosine metric),"
    assert titles[1] == f"{method} a random 300 of 896 points, 5 classes)"
    assert titles[2] == f"{method} 5 classes)"  # all of them: no sample
    three = np.random.default_rng(0).choice(896, 3, replace=False)
    assert kdml("embed", run, "--out", tmp_path / "test.npz") == 0
    found = len(set(np.load(tmp_path / "test.npz")["labels"][three].tolist()))
    assert found < 5
    assert titles[0] == f"{method} a random 3 of 896 points, {found} of 5 classes)"


@pytest.mark.parametrize("small", [False, True], ids=["digits", "16 test images"])
def test_an_atlas_retrieval_grid_shows_the_neighbours_its_metrics_rank(runs, tmp_path,
                                                                        monkeypatch, capsys,
                                                                        small):
    """Within the query's chart, by the Euclidean distance of the chart coordinates: the grid
    had ranked the stand-in embedding (sigmoid coordinates and a one-hot chart), and drew hits
    and misses that neither the run's Recall@K nor kdml search had. With 16 test images dealt
    into 3 charts and k = 15, every chart holds fewer: the rest of each row is empty (-1), never
    a hit, and a warning says so (the short rows had been drawn without a word)."""
    from fixtures_array_sets import make_csv_list

    from kdml.evaluation.evaluator import chart_codes_of
    from kdml.inspection import plots

    run = tmp_path / "atlas"
    if small:
        csv_file = make_csv_list(tmp_path, classes=8, per_class=4)
        assert kdml("train", "mtriplet", "--dataset", f"csv:{csv_file}", "--out", run, *TINY,
                    "method.n_charts=3", "data.batch_size=8", "data.samples_per_class=2",
                    "data.resize=28", "data.image_size=24", "eval.ks=[1]") == 0
    else:
        shutil.copytree(runs / "atlas", run)
    k = 15 if small else 6
    drawn = {}

    def grid(queries, neighbours, hits, image, path, titles=None, gallery=None):
        drawn.update(queries=queries, neighbours=neighbours, hits=hits)
        return path

    def codes_of(*args):
        embedded = chart_codes_of(*args)
        coords, charts = (part.cpu() for part in embedded.values)
        if small:  # a few steps leave all 16 in one chart: dealt round-robin, 5 or 6 a chart
            charts = torch.arange(len(charts)) % 3
        drawn["codes"] = coords.double().numpy(), charts.numpy()
        return embedded._replace(values=(coords, charts))

    monkeypatch.setattr(plots, "plot_retrieval_grid", grid)
    monkeypatch.setattr(plots, "chart_codes_of", codes_of)
    capsys.readouterr()
    assert kdml("plot", "retrieval", run, "--queries", "16", "-k", k) == 0
    warned = capsys.readouterr().err
    assert kdml("embed", run, "--out", tmp_path / "codes.npz") == 0
    codes = np.load(tmp_path / "codes.npz")
    coords, charts = drawn["codes"]
    if not small:  # what kdml embed writes, and kdml search searches
        assert np.array_equal(charts, codes["chart_index"])
        assert np.allclose(coords, codes["chart_coords"], atol=1e-6)
    labels = codes["labels"]
    row_of = {int(position): row for row, position in enumerate(codes["positions"])}
    empty = 0
    for query, neighbours, hits in zip(drawn["queries"], drawn["neighbours"], drawn["hits"],
                                       strict=True):
        q = row_of[int(query)]
        mates = [r for r in range(len(coords)) if charts[r] == charts[q] and r != q]
        distances = sorted(float(np.linalg.norm(coords[r] - coords[q])) for r in mates)[:k]
        listed = [row_of[int(position)] for position in neighbours if position >= 0]
        assert [float(np.linalg.norm(coords[r] - coords[q])) for r in listed] == pytest.approx(
            distances, abs=1e-6)
        assert all(charts[r] == charts[q] for r in listed)
        assert hits[:len(listed)].tolist() == [labels[r] == labels[q] for r in listed]
        assert len(listed) == min(k, len(mates))  # the found ones first, then empty places
        assert (neighbours[len(listed):] == -1).all() and not hits[len(listed):].any()
        empty += k - len(listed)
    assert (empty > 0) == small
    # 16 dealt round-robin into 3 charts: 6, 5 and 5, so 4 or 5 others in a query's chart
    assert ("kdml: warning: the retrieval grid shows fewer than 15 neighbours in 16 of its 16 "
            "rows (4 at the fewest): an Atlas run's queries are searched within their chart, "
            "and those charts hold fewer other test images" in warned) == small
    assert "neighbours in" not in warned or small


def test_a_retrieval_grid_draws_the_images_its_rows_embed_around_skipped_files(tmp_path,
                                                                              monkeypatch):
    """With data.on_bad_image=skip an unreadable test image has no row: the grid's queries and
    neighbours are the dataset positions of the readable images the rows embed (kdml embed's
    positions), each hit a neighbour of the query's class, never a skipped file."""
    from kdml.inspection import plots

    folder = folder_with_unreadable_test_images(tmp_path)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", run, *TINY,
                "data.batch_size=4", "data.resize=36", "data.image_size=32", "eval.ks=[1]",
                "data.on_bad_image=skip", "data.num_workers=0") == 0
    assert kdml("embed", run, "--out", tmp_path / "test.npz") == 0
    embedded = np.load(tmp_path / "test.npz")
    readable = embedded["positions"].tolist()
    assert len(readable) == 8 and readable != list(range(8))
    # each row's source is the file its position names, never a skipped one
    assert not any("a_bad" in source for source in embedded["sources"].tolist())
    label_of = dict(zip(readable, embedded["labels"].tolist(), strict=True))
    drawn = {}

    def grid(queries, neighbours, hits, image, path, titles, gallery=None):
        drawn.update(queries=queries.tolist(), neighbours=neighbours.tolist(),
                     hits=hits.tolist())
        return path

    monkeypatch.setattr(plots, "plot_retrieval_grid", grid)
    assert kdml("plot", "retrieval", run, "--queries", "8", "-k", "7") == 0
    assert sorted(drawn["queries"]) == readable
    for query, row, marks in zip(drawn["queries"], drawn["neighbours"], drawn["hits"],
                                 strict=True):
        assert sorted([query, *row]) == readable  # the 7 others, each once
        assert marks == [label_of[position] == label_of[query] for position in row]


def test_eval_json_records_the_unreadable_images_its_scoring_left_out(tmp_path):
    """kdml eval with data.on_bad_image=skip: eval.json's metrics are of the readable test
    images, and it says how many of the listed ones were left out and which (the warning on
    stderr was all there was: the run folder did not keep it)."""
    folder = folder_with_unreadable_test_images(tmp_path)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", run, *TINY,
                "data.batch_size=4", "data.resize=36", "data.image_size=32", "eval.ks=[1]",
                "data.on_bad_image=skip", "data.num_workers=0") == 0
    assert kdml("eval", run) == 0
    record = json.loads((run / "eval.json").read_text())
    assert record["unreadable"] == {"test": {"listed": 12, "left_out": [
        str(folder / name / f"a_bad{index}.jpg") for name in ("c02", "c03") for index in (0, 1)]}}
    (folder / "c02" / "a_bad0.jpg").unlink()
    (folder / "c02" / "a_bad1.jpg").unlink()
    (folder / "c03" / "a_bad0.jpg").unlink()
    (folder / "c03" / "a_bad1.jpg").unlink()
    (run / "data.json").unlink()  # other files now: scored on purpose
    assert kdml("eval", run) == 0
    assert "unreadable" not in json.loads((run / "eval.json").read_text())


def test_an_atlas_grid_never_shows_a_query_as_its_own_neighbour(runs, tmp_path, monkeypatch):
    """Test digits in pairs at the same chart codes: each query's twin (distance 0, tied with
    the query itself) is its first neighbour, and the query is never in its own row, whichever
    of the two the search lists first."""
    from kdml.evaluation.evaluator import chart_codes_of
    from kdml.inspection import plots

    run = tmp_path / "atlas"
    shutil.copytree(runs / "atlas", run)

    def codes_of(*args):
        embedded = chart_codes_of(*args)
        coords, charts = embedded.values
        first = torch.arange(len(charts)) // 2 * 2  # rows 2i and 2i + 1 alike
        return embedded._replace(values=(coords[first], charts[first]))

    drawn = {}

    def grid(queries, neighbours, hits, image, path, titles=None, gallery=None):
        drawn.update(queries=queries.tolist(), neighbours=neighbours.tolist())
        return path

    monkeypatch.setattr(plots, "chart_codes_of", codes_of)
    monkeypatch.setattr(plots, "plot_retrieval_grid", grid)
    assert kdml("plot", "retrieval", run, "--queries", "32", "-k", "3") == 0
    for query, row in zip(drawn["queries"], drawn["neighbours"], strict=True):
        assert query not in row and row[0] == query ^ 1  # its twin, then two others


def test_a_chart_plot_s_thumbnails_are_the_images_its_rows_embed_around_skipped_files(
        tmp_path, monkeypatch):
    """plot charts with data.on_bad_image=skip: the thumbnail of each point is the image that
    point embeds (its dataset position, kdml embed's positions), not the image at its row."""
    from kdml.data.transforms import to_unit_float
    from kdml.inspection import plots
    from kdml.training.loading import load_run

    folder = folder_with_unreadable_test_images(tmp_path)
    run = tmp_path / "run"
    assert kdml("train", "mtriplet", "--dataset", f"folder:{folder}", "--out", run, *TINY,
                "method.n_charts=2", "method.dim=2", "data.batch_size=4",
                "data.samples_per_class=2", "data.resize=36", "data.image_size=32",
                "eval.ks=[1]", "data.on_bad_image=skip", "data.num_workers=0") == 0
    assert kdml("embed", run, "--out", tmp_path / "test.npz") == 0
    readable = np.load(tmp_path / "test.npz")["positions"].tolist()
    assert len(readable) == 8 and readable != list(range(8))
    drawn = {}
    monkeypatch.setattr(plots, "plot_charts",
                        lambda coords, index, labels, path, **options: drawn.update(options)
                        or path)
    assert kdml("plot", "charts", run) == 0
    test = load_run(run).splits.test
    for row, position in enumerate(readable):
        assert torch.equal(drawn["images"](row), to_unit_float(test.load(position)))
    assert drawn["class_names"] == {i: f"c{i:02d}" for i in range(4)}  # the legend names them


def test_the_retrieval_grid_s_seed_draws_its_queries(runs, tmp_path, monkeypatch):
    """--seed picks which test samples the grid shows: the same seed the same queries, another
    seed others."""
    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    grids = drawn_grids(monkeypatch)
    for seed in (0, 0, 1):
        assert kdml("plot", "retrieval", run, "--queries", "8", "-k", "2", "--seed", seed) == 0
    drawn = [grid["queries"] for grid in grids]
    assert drawn[0] == drawn[1] != drawn[2]
    assert drawn[0] == np.random.default_rng(0).choice(896, 8, replace=False).tolist()


def test_a_cosine_run_s_grid_ranks_its_neighbours_by_direction(runs, tmp_path, monkeypatch):
    """Each test image among the others, in the order of the run's metric (cosine), as its
    Recall@K ranks them: every embedding lengthened by its own factor, which cosine ignores,
    draws the same rows."""
    from kdml.inspection import plots

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    grids = drawn_grids(monkeypatch)
    assert kdml("plot", "retrieval", run, "--queries", "16", "-k", "8") == 0
    monkeypatch.setattr(plots, "embed_dataset", lengthened_embeddings)
    assert kdml("plot", "retrieval", run, "--queries", "16", "-k", "8") == 0
    assert grids[0]["neighbours"] == grids[1]["neighbours"]


@pytest.mark.parametrize("query_gallery", [False, True])
def test_a_retrieval_grid_queries_only_samples_with_their_class_to_find(tmp_path, monkeypatch,
                                                                       capsys, query_gallery):
    """A test sample alone in its class, or a query whose class has no gallery image, has
    nothing of its class to retrieve: the grid leaves it out, and says it shows fewer."""
    from fixtures_array_sets import make_csv_list

    from kdml.inspection import plots

    csv_file = make_csv_list(tmp_path, classes=6, per_class=4, query_gallery=query_gallery)
    header, *rows = csv_file.read_text().splitlines()
    lone = [row for row in rows if ",label_05," in row]
    if query_gallery:  # label_05: queries only; label_03 and 04: 2 queries, 2 gallery images
        rows = [row for row in rows if row not in lone] + [
            ",".join([*row.split(",")[:3], "1", "0"]) for row in lone]
    else:  # label_05: one test sample; label_03 and 04: four each
        rows = [row for row in rows if row not in lone[1:]]
    csv_file.write_text("\n".join([header, *rows]) + "\n")
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"csv:{csv_file}", "--out", run, *TINY,
                "data.batch_size=4", "data.resize=28", "data.image_size=24",
                "eval.ks=[1]") == 0
    drawn = {}

    def grid(queries, neighbours, hits, image, path, titles, gallery=None):
        drawn["classes"] = sorted(titles(int(query)) for query in queries)
        drawn["shape"], drawn["all_found"] = neighbours.shape, bool((neighbours >= 0).all())
        return path

    monkeypatch.setattr(plots, "plot_retrieval_grid", grid)
    capsys.readouterr()
    assert kdml("plot", "retrieval", run, "--queries", "12", "-k", "1") == 0
    eligible = 4 if query_gallery else 8
    assert drawn["classes"] == sorted(["label_03", "label_04"] * (eligible // 2))
    assert (f"the retrieval grid shows {eligible} queries, not 12: only {eligible} test samples "
            "have another of their class to retrieve") in capsys.readouterr().err
    # a -k beyond the searched images: each row shows all of them, never an empty place
    assert kdml("plot", "retrieval", run, "--queries", "12", "-k", "64") == 0
    besides = 4 if query_gallery else 8  # the gallery's images, or the test part's others
    assert drawn["shape"] == (eligible, besides) and drawn["all_found"]
    assert (f"the retrieval grid shows {besides} neighbours per query, not 64: "
            + ("the gallery holds only 4 images" if query_gallery else
               "the test part holds only 8 images besides the query")) in capsys.readouterr().err


@pytest.mark.parametrize("command", ["retrieval", "embedding"])
def test_a_collapsed_embedding_is_not_drawn(runs, tmp_path, capsys, monkeypatch, command):
    """Every test digit embedded alike (JIntra at alpha = 2 does it on Fashion-MNIST): t-SNE
    crashed the process on it (a segmentation fault), and a retrieval grid would show the
    search's order of tied neighbours as hits and misses."""
    from kdml.training.recipes.jrd import JRDMethod

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    (run / "plots" / f"{command}.png").unlink(missing_ok=True)  # drawn by another test
    monkeypatch.setattr(JRDMethod, "embed", lambda self, inputs: torch.ones(len(inputs), 8))
    capsys.readouterr()
    assert kdml("plot", command, run) == 2
    picture = ("a 2-D map of them" if command == "embedding"
               else "a grid of their nearest neighbours")
    assert capsys.readouterr().err == (
        "kdml: error: the test embeddings have collapsed: 100.0% of them lie at one point "
        f"(exactly): {picture} would show ties and float rounding, not the model; train the run "
        "again with lower learning rates\n")
    assert not (run / "plots" / f"{command}.png").exists()


def test_an_atlas_grid_of_points_alike_only_across_charts_is_drawn(runs, tmp_path,
                                                                     monkeypatch):
    """Points of different charts are infinitely far apart (chart_collapse): the same chart
    coordinates in three charts, a third of the test digits in each, are no collapse, as the
    run's metrics take them; the grid is drawn, not refused as "collapsed"."""
    from kdml.evaluation.evaluator import chart_codes_of
    from kdml.inspection import plots

    run = tmp_path / "atlas"
    shutil.copytree(runs / "atlas", run)

    def codes_of(*args):
        embedded = chart_codes_of(*args)
        coords, charts = embedded.values
        return embedded._replace(values=(torch.full_like(coords, 0.5),
                                         torch.arange(len(charts)) % 3))

    monkeypatch.setattr(plots, "chart_codes_of", codes_of)
    monkeypatch.setattr(plots, "plot_retrieval_grid",
                        lambda queries, neighbours, hits, image, path, *_, **__: path)
    assert kdml("plot", "retrieval", run, "--queries", "4", "-k", "2") == 0


def test_the_generalization_terms_of_a_collapsed_embedding_come_with_a_warning(
        runs, tmp_path, capsys, monkeypatch):
    """1-NN classifiers among exact ties decide by the order of their training rows: the
    terms are computed and written, beside a warning for each collapsed part."""
    from kdml.training.recipes.jrd import JRDMethod

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    monkeypatch.setattr(JRDMethod, "embed", lambda self, inputs: torch.ones(len(inputs), 8))
    capsys.readouterr()
    assert kdml("analyze", "generalization", run, "--repeats", "2") == 0
    err = capsys.readouterr().err
    for part in ("the seen classes' embeddings", "the unseen (test) classes' embeddings"):
        assert (f"kdml: warning: {part} have collapsed: 100.0% of them lie at one point "
                "(exactly), so") in err
    assert err.count("the H-divergence and lambda say little of the model") == 2
    assert (run / "generalization.json").is_file()



def test_generalization_judges_collapse_by_the_cosine_of_a_cosine_run(runs, tmp_path, capsys,
                                                                      monkeypatch):
    """Rows of one direction at many lengths have collapsed for the cosine the run is scored
    (and its 1-NN classifiers rank) by, though not as points: the analysis warns of them."""
    from kdml.training.recipes.jrd import JRDMethod

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    assert yaml.safe_load((run / "config.yaml").read_text())["eval"]["metric"] == "cosine"
    direction = torch.linspace(1.0, 2.0, 8)

    def one_direction(self, inputs):
        return torch.linspace(0.5, 4.0, len(inputs))[:, None] * direction

    monkeypatch.setattr(JRDMethod, "embed", one_direction)
    capsys.readouterr()
    assert kdml("analyze", "generalization", run, "--repeats", "2") == 0
    err = capsys.readouterr().err
    assert err.count("have collapsed: 100.0% of them lie at one point") == 2, err

def test_plots_never_replace_a_picture_kdml_did_not_draw(runs, tmp_path, capsys, monkeypatch):
    from PIL import Image

    from kdml.inspection import plots

    def no_embedding(*args, **kwargs):
        raise AssertionError("embedded before refusing the picture in the way")

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    # small pictures (2 query rows, a map without t-SNE): what is tested is which file is
    # replaced, not what it shows
    monkeypatch.setattr(plots, "embedding_map", unmapped)
    for command, option in (("retrieval", ["-k", "4", "--queries", "2"]),
                            ("embedding", ["--max-points", "60"])):
        mine = run / "plots" / f"{command}.png"
        Image.new("RGB", (4, 4)).save(mine)
        picture = mine.read_bytes()
        capsys.readouterr()
        with monkeypatch.context() as patch:  # refused at once, before minutes of embedding
            patch.setattr(plots, "embed_dataset", no_embedding)
            assert kdml("plot", command, run, *option) == 2
        assert capsys.readouterr().err == (
            f"kdml: error: {mine} is in the way and kdml did not draw it; move it away (kdml "
            "never replaces a file it did not write)\n")
        assert mine.read_bytes() == picture
        mine.unlink()
        assert kdml("plot", command, run, *option) == 0
        assert kdml("plot", command, run, *option) == 0  # kdml's own picture is redrawn


def test_plot_retrieval_and_image_queries_need_images(tmp_path, capsys):
    from PIL import Image

    run = tmp_path / "signals"
    assert kdml("train", "amsoftmax", "--dataset", "mnist1d", "--out", run, *TINY) == 0
    capsys.readouterr()
    assert kdml("plot", "retrieval", run) == 2
    assert "not images" in capsys.readouterr().err
    assert kdml("index", run, "--out", tmp_path / "index") == 0
    Image.new("L", (40, 1)).save(tmp_path / "query.png")
    capsys.readouterr()
    assert kdml("search", run, "--index", tmp_path / "index", "--query",
                tmp_path / "query.png") == 2
    assert "need a run trained on images" in capsys.readouterr().err
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 1


def test_only_pixel_samples_take_image_queries():
    """A decoded image matches uint8 or [0, 1] float samples of 1 or 3 channels, and nothing
    else shaped like an image (standardised features would be compared on the wrong scale)."""
    from kdml.data.dataset import ArrayDataset
    from kdml.data.sample_spec import holds_pixels

    labels = torch.zeros(4, dtype=torch.long)
    unit = torch.rand(4, 1, 5, 5, generator=torch.Generator().manual_seed(0))
    cases = {"uint8": ((unit * 255).to(torch.uint8), True), "unit float": (unit, True),
             "rgb": (unit.expand(4, 3, 5, 5), True), "standardised": (unit * 4 - 2, False),
             "two channels": (unit.expand(4, 2, 5, 5), False), "vectors": (unit[:, 0, 0], False)}
    for name, (x, expected) in cases.items():
        assert holds_pixels(ArrayDataset("t", "t", x, labels)) is expected, name


def test_embeddings_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from kdml.inspection import parts

    path = parts.write_npz(tmp_path / "emb.npz", {"labels": np.arange(3)})
    assert np.load(path)["labels"].tolist() == [0, 1, 2]

    def killed_mid_write(handle, **arrays):
        handle.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(parts.np, "savez", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        parts.write_npz(tmp_path / "cut.npz", {"labels": np.arange(3)})
    assert list(tmp_path.iterdir()) == [path]  # nothing of the cut one: run it again


def test_an_interrupted_index_build_leaves_nothing_and_can_be_run_again(runs, tmp_path,
                                                                        capsys, monkeypatch):
    """A build killed while writing leaves neither a half-built index nor a folder that the
    same command would refuse; an empty folder made beforehand is filled; a full one is
    refused before anything is embedded."""
    from kdml.evaluation import index as index_module

    def interrupted(*_):
        raise KeyboardInterrupt

    out = tmp_path / "gallery" / "index"
    monkeypatch.setattr(index_module.faiss, "write_index", interrupted)
    assert kdml("index", runs / "plain", "--out", out) == 130  # "kdml: interrupted"
    assert not out.exists() and list((tmp_path / "gallery").iterdir()) == []
    monkeypatch.undo()
    assert kdml("index", runs / "plain", "--out", out) == 0
    assert sorted(path.name for path in out.iterdir()) == ["index.faiss", "index.json",
                                                           "items.npz"]
    assert out.stat().st_mode & 0o777 == (tmp_path / "gallery").stat().st_mode & 0o777
    made = tmp_path / "made"
    made.mkdir()
    assert kdml("index", runs / "plain", "--out", made) == 0
    assert (made / "index.json").is_file()
    capsys.readouterr()
    monkeypatch.setattr("kdml.inspection.parts.embed_part", interrupted)  # never reached
    assert kdml("index", runs / "plain", "--out", made) == 2
    assert "not an empty folder" in capsys.readouterr().err


def test_an_index_out_that_is_a_file_is_called_a_file(tmp_path):
    from kdml.evaluation.index import check_index_folder

    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(KdmlError, match=f"^--out {afile} is a file; an index goes into a new "
                                        "folder: choose another --out$"):  # not "an empty..."
        check_index_folder(afile)
    assert afile.read_text() == "mine"


def test_an_index_out_that_is_the_current_folder_is_refused(runs, tmp_path, capsys,
                                                            monkeypatch):
    """An empty current folder as --out had failed at the final rename, with "...partial-XXXX
    -> .: Device or resource busy"."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (".", "./", "../here"):
        capsys.readouterr()
        assert kdml("index", runs / "plain", "--out", out) == 2
        assert capsys.readouterr().err == (
            f"kdml: error: --out {Path(out)} is the folder you are in; an index goes into a "
            "folder of its own: give one such as --out index\n")
    assert list(tmp_path.iterdir()) == [here] and not any(here.iterdir())
    assert kdml("index", runs / "plain", "--out", "index") == 0  # a folder inside it is fine
    assert (here / "index" / "index.json").is_file()


@pytest.mark.parametrize("name", ["plain", "atlas"])
def test_raw_query_inputs_are_embedded_in_batches_as_one_batch_would_be(runs, tmp_path, name):
    """An .npz of raw inputs (it may hold a whole test split) is embedded batch by batch,
    with the same vectors and charts as in one batch."""
    import dataclasses

    from kdml.data.offline import load_digits
    from kdml.inspection.queries import query_vectors
    from kdml.inspection.search import RunWithoutData
    from kdml.training.loading import load_run

    images, _ = load_digits()
    np.savez(tmp_path / "raw.npz", inputs=images[:50].numpy())
    trained = load_run(runs / name)
    run = RunWithoutData(trained.run, trained.config, trained.checkpoint)
    whole = query_vectors(run, tmp_path / "raw.npz", name == "atlas", lambda: trained)
    sizes, original = [], trained.embedder.transform

    def transform(batch):
        sizes.append(len(batch))
        return original(batch)

    trained.embedder = dataclasses.replace(trained.embedder, batch_size=7, transform=transform)
    batched = query_vectors(run, tmp_path / "raw.npz", name == "atlas", lambda: trained)
    assert sizes == [7] * 7 + [1]
    assert batched[0].shape == whole[0].shape and len(batched[2]) == 50
    assert np.allclose(batched[0], whole[0], atol=1e-5)
    assert (batched[1] is None) == (name == "plain")
    if name == "atlas":
        assert np.array_equal(batched[1], whole[1])


def test_another_dataset_s_split_is_the_one_embedded(runs, tmp_path):
    """--dataset with --split train embeds that dataset's training part, with its labels, as
    the run's own --split train does for the same data."""
    for name, dataset in (("own", []), ("other", ["--dataset", "digits"])):
        for split in ("train", "test"):
            assert kdml("embed", runs / "plain", *dataset, "--split", split, "--out",
                        tmp_path / f"{name}-{split}.npz") == 0
    own, other = (np.load(tmp_path / f"{name}-train.npz") for name in ("own", "other"))
    assert set(other["labels"].tolist()) == {0, 1, 2, 3, 4}
    assert np.array_equal(other["labels"], own["labels"])
    assert np.allclose(other["embeddings"], own["embeddings"], atol=1e-6)
    test = np.load(tmp_path / "other-test.npz")
    assert set(test["labels"].tolist()) == {5, 6, 7, 8, 9}
    assert np.array_equal(test["labels"], np.load(tmp_path / "own-test.npz")["labels"])


def test_another_dataset_must_be_shaped_like_the_run_s_samples(runs, tmp_path, capsys):
    """A CNN with global pooling takes 28 x 28 images as readily as the 8 x 8 ones it was
    trained on, so a dataset of another sample shape is refused before it is embedded."""
    assert kdml("embed", runs / "plain", "--dataset", "digits", "--out",
                tmp_path / "same.npz") == 0
    for other, shape in (("mnist5k", "(1, 28, 28)"), ("mnist1d", "(40,)"),
                         ("mnist5k->digits", "")):
        capsys.readouterr()
        assert kdml("embed", runs / "plain", "--dataset", other, "--out",
                    tmp_path / "other.npz") == 2
        err = capsys.readouterr().err
        assert f"has samples of shape {shape}" in err and "(1, 8, 8)" in err
        assert err.count("\n") == 1
    assert kdml("index", runs / "atlas", "--dataset", "mnist1d", "--out",
                tmp_path / "index") == 2
    assert not (tmp_path / "other.npz").exists() and not (tmp_path / "index").exists()


def test_malformed_query_files_get_one_line_errors(runs, built, tmp_path, capsys):
    shutil.copytree(built / "plain-index", tmp_path / "plain-index")
    shutil.copytree(built / "atlas-index", tmp_path / "atlas-index")
    shutil.copy(built / "atlas.npz", tmp_path / "atlas.npz")
    codes = np.load(tmp_path / "atlas.npz")
    coords, charts = codes["chart_coords"][:3], codes["chart_index"][:3]
    vectors = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    cases = {  # file contents -> (run, index, the error's words)
        "int-inputs": (dict(inputs=np.zeros((2, 1, 8, 8), dtype=np.int64)), "plain",
                       "must be uint8 or float"),
        "no-rows": (dict(embeddings=np.float32(1.0)), "plain", "one row per query"),
        "nan-inputs": (dict(inputs=np.full((2, 1, 8, 8), np.nan, dtype=np.float32)), "plain",
                       "'inputs' holds NaN or infinite values"),
        # named by its file and row, as NaN 'inputs' are (it had said "queries contains ...")
        "nan-embeddings": (dict(embeddings=np.array([[1.0] * 8, [np.nan] * 8],
                                                    dtype=np.float32)), "plain",
                           "query " + str(tmp_path / "nan-embeddings.npz") + ": 'embeddings' "
                           "holds NaN or infinite values (row 1)"),
        # named by file and key, as NaN embeddings are (it had said "queries must have a
        # floating dtype, got int64" and "queries must be 2-D (N, D), got shape (8,)")
        "int-embeddings": (dict(embeddings=np.ones((2, 8), dtype=np.int64)), "plain",
                           "query " + str(tmp_path / "int-embeddings.npz") + ": 'embeddings' "
                           "must be floats, got int64"),
        "one-embedding": (dict(embeddings=np.ones(8, dtype=np.float32)), "plain",
                          "query " + str(tmp_path / "one-embedding.npz") + ": 'embeddings' "
                          "must be [Q, d], one row per query (one query as [1, d]), got "
                          "shape (8,)"),
        "int-coords": (dict(chart_coords=coords.astype(np.int32), chart_index=charts), "atlas",
                       "'chart_coords' must be floats, got int32"),
        "no-input-rows": (dict(inputs=np.zeros((0, 1, 8, 8), dtype=np.float32)), "plain",
                          "'inputs' must hold one row per query, got shape (0, 1, 8, 8)"),
        # named by its file, as the other errors are (it had said "query 0 is all zeros")
        "zero": (dict(embeddings=np.zeros((2, 8), dtype=np.float32)), "plain",
                 "zero.npz: row 0 is all zeros"),
        "narrow": (dict(embeddings=np.ones((2, 5), dtype=np.float32)), "plain",
                   "narrow.npz: the queries have dimension 5 but the index holds 8-d"),
        "no-charts": (dict(embeddings=codes["embeddings"][:3], chart_coords=coords), "atlas",
                      "needs 'chart_index'"),
        "short-charts": (dict(embeddings=codes["embeddings"][:3], chart_coords=coords,
                              chart_index=charts[:2]), "atlas", "one integer per row"),
        "float-charts": (dict(embeddings=codes["embeddings"][:3], chart_coords=coords,
                              chart_index=charts.astype(np.float32)), "atlas",
                         "one integer per row"),
        "chart-5": (dict(embeddings=codes["embeddings"][:3], chart_coords=coords,
                         chart_index=np.array([0, 5, 1])), "atlas", "chart_index[1] is 5"),
        "chart-3": (dict(chart_coords=coords, chart_index=np.array([0, 1, 3])), "atlas",
                    "chart_index[2] is 3, but the run has charts 0 to 2"),  # one past the last
        "chart--1": (dict(chart_coords=coords, chart_index=np.array([-1, 0, 0])), "atlas",
                     "chart_index[0] is -1, but the run has charts 0 to 2"),
        "both": (dict(embeddings=vectors, inputs=np.zeros((3, 1, 8, 8), dtype=np.float32)),
                 "plain", "holds both 'embeddings' and 'inputs'"),
        "both-atlas": (dict(chart_coords=coords, chart_index=charts[:3],
                            inputs=np.zeros((3, 1, 8, 8), dtype=np.float32)),
                       "atlas", "holds both 'chart_coords' and 'inputs'"),
        # an Atlas run cannot search embeddings: not "either could be meant"
        "embeddings-inputs-atlas": (dict(embeddings=codes["embeddings"][:3],
                                         inputs=np.zeros((3, 1, 8, 8), dtype=np.float32)),
                                    "atlas", "an Atlas run searches chart coordinates"),
        "no-coords": (dict(embeddings=codes["embeddings"][:3]), "atlas",
                      "needs 'chart_coords' for this Atlas run"),
        "nothing": (dict(labels=np.arange(3)), "atlas",
                    "holds neither 'chart_coords' nor 'inputs'"),
    }
    for name, (arrays, run, words) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        capsys.readouterr()
        assert kdml("search", runs / run, "--index", tmp_path / f"{run}-index", "--query",
                    tmp_path / f"{name}.npz") == 2, name
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, (name, err)
    for query, words in ((tmp_path, "is not a file"), (tmp_path / "nope.npz", "does not exist")):
        assert kdml("search", runs / "plain", "--index", tmp_path / "plain-index", "--query",
                    query) == 2
        assert words in capsys.readouterr().err
    # the query names follow the searched array, not the file's first one
    np.savez(tmp_path / "labelled.npz", labels=np.arange(5), embeddings=vectors)
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "plain-index", "--query",
                tmp_path / "labelled.npz", "-k", "2", "--json") == 0
    assert [r["query"] for r in json.loads(capsys.readouterr().out)] == [
        f"labelled.npz[{i}]" for i in range(3)]
    # raw inputs are named by their rows too, and an .NPZ in capitals is an .npz
    np.savez(tmp_path / "raw.npz", inputs=np.zeros((2, 1, 8, 8), dtype=np.float32))
    with (tmp_path / "CAPS.NPZ").open("wb") as handle:
        np.savez(handle, embeddings=vectors)
    for query, names in (("raw.npz", ["raw.npz[0]", "raw.npz[1]"]),
                         ("CAPS.NPZ", [f"CAPS.NPZ[{i}]" for i in range(3)])):
        capsys.readouterr()
        assert kdml("search", runs / "plain", "--index", tmp_path / "plain-index", "--query",
                    tmp_path / query, "-k", "2", "--json") == 0
        assert [r["query"] for r in json.loads(capsys.readouterr().out)] == names


def test_cosine_queries_of_any_magnitude_find_what_unit_ones_find(runs, built, tmp_path, capsys):
    """Cosine similarity ignores length: queries scaled by 1e37 or 1e-42 (finite float32)
    rank the gallery as the unscaled ones do, instead of overflowing or underflowing."""
    shutil.copytree(built / "plain-index", tmp_path / "index")
    shutil.copy(built / "plain.npz", tmp_path / "test.npz")
    base = np.load(tmp_path / "test.npz")["embeddings"][:4].astype(np.float64)
    found = {scale: searched_sources(runs / "plain", tmp_path, capsys,
                                     embeddings=(base * scale).astype(np.float32))
             for scale in (1.0, 1e37, 1e-42)}
    assert found[1.0][0][0] == "digits/test[0]"
    assert found[1e37] == found[1.0] and found[1e-42][0][0] == "digits/test[0]"


def test_a_search_that_finds_fewer_than_k_says_so(runs, built, tmp_path, capsys):
    shutil.copytree(built / "plain-index", tmp_path / "index")
    np.savez(tmp_path / "q.npz", embeddings=np.ones((2, 8), dtype=np.float32))
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz", "-k", "1000", "--json") == 0
    printed = capsys.readouterr()
    assert [len(r["neighbours"]) for r in json.loads(printed.out)] == [896, 896]
    assert "2 of 2 queries found fewer than 1000 neighbours" in printed.err
    assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz", "-k", "5") == 0
    assert "fewer" not in capsys.readouterr().err
    # one query in the singular (it had said "1 of 1 queries")
    np.savez(tmp_path / "one.npz", embeddings=np.ones((1, 8), dtype=np.float32))
    assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                tmp_path / "one.npz", "-k", "1000") == 0
    assert "note: 1 of 1 query found fewer than 1000 neighbours" in capsys.readouterr().err
    # a -k far beyond the index allocates only what the index can give, plain and Atlas
    shutil.copytree(built / "atlas-index", tmp_path / "atlas-index")
    shutil.copy(built / "atlas.npz", tmp_path / "atlas.npz")
    # 28 of its 896 test samples, spread over the split, as queries: what is tested is -k, not
    # how many queries ask it (each of 896 would print up to 896 neighbours as JSON)
    with np.load(tmp_path / "atlas.npz") as embedded:
        rows = len(embedded["labels"])
        np.savez(tmp_path / "atlas-few.npz", **{
            key: embedded[key][::32] if embedded[key].ndim and len(embedded[key]) == rows
            else embedded[key] for key in embedded.files})
    for run, index, query in (("plain", "index", "q.npz"),
                              ("atlas", "atlas-index", "atlas-few.npz")):
        capsys.readouterr()
        assert kdml("search", runs / run, "--index", tmp_path / index, "--query",
                    tmp_path / query, "-k", str(10**19), "--json") == 0
        printed = capsys.readouterr()
        assert max(len(r["neighbours"]) for r in json.loads(printed.out)) <= 896
        assert f"fewer than {10**19} neighbours" in printed.err


@pytest.mark.parametrize("damage", ["truncated", "no labels", "too few rows", "no chart",
                                    "labels as a column", "labels as text", "chart as floats",
                                    "too few class names"])
def test_a_damaged_index_is_refused_in_one_line(runs, built, tmp_path, capsys, damage):
    """The last four had stopped the search with a traceback (TypeError, ValueError,
    IndexError)."""
    run = "atlas" if "chart" in damage else "plain"
    shutil.copytree(built / f"{run}-index", tmp_path / "index")  # damaged below
    shutil.copy(built / f"{run}.npz", tmp_path / "q.npz")
    items = tmp_path / "index" / "items.npz"
    arrays = dict(np.load(items))
    if damage == "truncated":
        items.write_bytes(items.read_bytes()[:100])
    elif damage == "too few class names":  # had stopped the search with an IndexError
        np.savez(items, **arrays, class_names=np.array(["five", "six"]))
    elif damage in ("labels as a column", "labels as text", "chart as floats"):
        key = "chart" if "chart" in damage else "labels"
        arrays[key] = {"labels as a column": arrays[key][:, None],
                       "labels as text": arrays[key].astype(str),
                       "chart as floats": arrays[key] + 0.5}[damage]
        np.savez(items, **arrays)
    else:
        key = {"no labels": "labels", "no chart": "chart"}.get(damage)
        arrays = ({name: value for name, value in arrays.items() if name != key} if key
                  else {name: value[:10] for name, value in arrays.items()})
        np.savez(items, **arrays)
    capsys.readouterr()
    assert kdml("search", runs / run, "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: {tmp_path / 'index'} holds a damaged index (")
    assert err.count("\n") == 1 and "build it again with 'kdml index'" in err


@pytest.mark.parametrize(("run", "name", "damage"), [
    ("plain", "items.npz", "missing"), ("plain", "index.faiss", "missing"),
    ("atlas", "chart_*.faiss", "missing"), ("plain", "index.faiss", "unreadable"),
    ("atlas", "chart_*.faiss", "unreadable"), ("plain", "items.npz", "unreadable")])
def test_a_missing_or_unreadable_index_file_is_named(runs, built, tmp_path, capsys, run, name,
                                                     damage):
    """A missing items.npz had been refused as "a damaged index (FileNotFoundError)", a missing
    or truncated faiss file as "(RuntimeError)": which file was at fault went unsaid."""
    shutil.copytree(built / f"{run}-index", tmp_path / "index")
    shutil.copy(built / f"{run}.npz", tmp_path / "q.npz")
    path = sorted((tmp_path / "index").glob(name))[-1]
    if damage == "missing":
        path.unlink()
        words = f"its {path.name} is missing"
    else:
        path.write_bytes(path.read_bytes()[:40])
        error = "BadZipFile" if name == "items.npz" else "RuntimeError"
        words = f"{path.name} is unreadable: {error}"
    capsys.readouterr()
    assert kdml("search", runs / run, "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz") == 2
    assert capsys.readouterr().err == damaged_index(tmp_path, words)


def test_an_index_with_the_faiss_file_of_another_index_is_refused(runs, built, tmp_path, capsys):
    """index.faiss copied from an index of another split: its positions would name other
    items' labels and sources (or none)."""
    shutil.copytree(built / "plain-index", tmp_path / "index")
    assert kdml("index", runs / "plain", "--split", "train", "--out", tmp_path / "train") == 0
    count = json.loads((tmp_path / "index" / "index.json").read_text())["count"]
    stored = faiss.read_index(str(tmp_path / "train" / "index.faiss")).ntotal
    assert stored != count
    shutil.copy(tmp_path / "train" / "index.faiss", tmp_path / "index" / "index.faiss")
    assert refused_search(runs / "plain", tmp_path, capsys) == damaged_index(
        tmp_path, f"its faiss files hold {stored} vectors, index.json says {count}")


def test_unwritable_outputs_are_refused_before_anything_is_embedded(runs, tmp_path, capsys,
                                                                     monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")

    def never(*_):
        raise AssertionError("embedded before the output was checked")

    monkeypatch.setattr("kdml.inspection.parts.embed_part", never)
    for command in (["embed", runs / "plain", "--out", tmp_path / "notes.txt" / "e.npz"],
                    ["embed", runs / "plain", "--out", Path("/proc/kdml-e.npz")],
                    ["index", runs / "plain", "--out", tmp_path / "notes.txt" / "index"],
                    ["index", runs / "plain", "--out", Path("/proc/kdml-index")]):
        assert kdml(*command) == 2
        err = capsys.readouterr().err
        assert err.startswith("kdml: error: cannot ") and err.count("\n") == 1, (command, err)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_command_that_fails_before_writing_leaves_no_new_folder(runs, tmp_path, capsys,
                                                                   monkeypatch):
    """--out's missing folders are made when the file is written, not by the checks before:
    a command that fails in between leaves nothing behind."""

    def fails(*_):
        raise KdmlError("the embedding failed")

    with monkeypatch.context() as patched:
        patched.setattr("kdml.inspection.parts.embed_part", fails)
        for command in (["embed", runs / "plain", "--out", tmp_path / "new" / "sub" / "e.npz"],
                        ["index", runs / "plain", "--out", tmp_path / "new" / "sub" / "index"]):
            assert kdml(*command) == 2
            assert capsys.readouterr().err == "kdml: error: the embedding failed\n"
            assert not (tmp_path / "new").exists()
    assert kdml("embed", runs / "plain", "--out", tmp_path / "new" / "sub" / "e.npz") == 0
    assert (tmp_path / "new" / "sub" / "e.npz").is_file()


def test_a_query_that_is_not_an_npz_archive_says_so(runs, built, tmp_path, capsys):
    shutil.copytree(built / "plain-index", tmp_path / "index")
    (tmp_path / "q.npz").write_text("not an archive")
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz") == 2
    err = capsys.readouterr().err
    assert "is not an .npz archive" in err and "pickle" not in err


def test_a_small_ivf_index_searches_exactly_without_faiss_warnings(tmp_path, capfd):
    """Below two cells' worth of points (39 each) an IVF index would be one cell, an exact
    search: a flat index does it, and faiss's k-means never warns of too few points."""
    from kdml.evaluation.index import IndexInfo, build_index, load_index, search_index

    vectors = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    items = {"labels": np.arange(30), "positions": np.arange(30),
             "sources": np.array([f"v[{i}]" for i in range(30)])}
    capfd.readouterr()
    build_index(tmp_path / "ivf", vectors, items, IndexInfo("run", "x", "euclidean", 0, "ivf", 0,
                                                            1.0))
    assert "WARNING" not in capfd.readouterr().err
    _, positions = search_index(load_index(tmp_path / "ivf"), vectors[:5], 3)
    exact = np.argsort(((vectors[:5, None] - vectors[None]) ** 2).sum(-1), axis=1)[:, :3]
    assert np.array_equal(positions, exact)
    # above that, at least 39 points a cell: 5 cells for 200 points (not 4 sqrt(200) = 56)
    more = np.random.default_rng(1).normal(size=(200, 4)).astype(np.float32)
    build_index(tmp_path / "ivf-200", more, {key: np.arange(200) for key in ("labels", "positions")}
                | {"sources": np.array([f"v[{i}]" for i in range(200)])},
                IndexInfo("run", "x", "euclidean", 0, "ivf", 0, 1.0))
    assert "WARNING" not in capfd.readouterr().err
    ivf = faiss.extract_index_ivf(faiss.read_index(str(tmp_path / "ivf-200" / "index.faiss")))
    assert (ivf.nlist, ivf.nprobe) == (5, 5)
    with pytest.raises(KdmlError, match="-k must be at least 1, got 0"):
        search_index(load_index(tmp_path / "ivf"), vectors[:5], 0)
    # a query 1e12 times the indexed vectors' scale is refused, not searched in float32 ties
    with pytest.raises(KdmlError, match="times the indexed vectors' scale, too far for a"):
        search_index(load_index(tmp_path / "ivf"), vectors[:1] * 1e12, 3)


@pytest.mark.parametrize("kind", ["exact", "hnsw"])
def test_an_index_of_embeddings_far_from_the_origin_finds_the_exact_neighbours(tmp_path, kind):
    """An index holds its vectors shifted by their median (index.json's centre), and shifts
    its queries alike: float32 distances 10,000 away from the origin ranked at random."""
    from kdml.evaluation.index import IndexInfo, build_index, load_index, search_index

    vectors = np.random.default_rng(1).normal(size=(60, 4)) + 1e4
    items = {"labels": np.arange(60), "positions": np.arange(60),
             "sources": np.array([f"v[{i}]" for i in range(60)])}
    build_index(tmp_path / kind, vectors, items, IndexInfo("run", "x", "euclidean", 0, kind, 0,
                                                           1.0))
    queries = vectors[:8] + 0.01
    distances, positions = search_index(load_index(tmp_path / kind), queries, 5)
    exact = ((queries[:, None] - vectors[None]) ** 2).sum(-1)
    assert np.array_equal(positions, np.argsort(exact, axis=1)[:, :5])
    assert np.allclose(distances, np.sqrt(np.sort(exact, axis=1)[:, :5]), rtol=1e-4)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_an_atlas_index_s_scores_are_in_the_embeddings_units_and_nan_where_none(tmp_path,
                                                                               metric):
    """Per chart: Euclidean distances in the embeddings' own units (the index divided them by
    its scale) or cosine similarities, against a literal float64 search of the query's chart;
    past the chart's size, position -1 and score NaN (not faiss's filler value)."""
    from kdml.evaluation.index import IndexInfo, build_index, load_index, search_index

    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(30, 4)) * 1e12  # beyond float32's safe squares
    charts = np.repeat([0, 1, 2], [5, 10, 15])
    items = {"labels": np.arange(30), "positions": np.arange(30),
             "sources": np.array([f"v[{i}]" for i in range(30)])}
    info = build_index(tmp_path / "index", vectors, items,
                       IndexInfo("run", "x", metric, 0, "exact", 0, 1.0), chart_index=charts)
    assert info.scale > 1e10  # the division matters
    queries, query_charts = rng.normal(size=(6, 4)) * 1e12, np.array([0, 1, 2, 0, 1, 2])
    scores, positions = search_index(load_index(tmp_path / "index"), queries, 12, query_charts)
    assert scores.shape == positions.shape == (6, 12)
    for query, chart, row_scores, row_positions in zip(queries, query_charts, scores, positions,
                                                       strict=True):
        members = np.flatnonzero(charts == chart)
        if metric == "euclidean":
            literal = [math.dist(query, vectors[m]) for m in members]
        else:
            literal = [float(np.dot(query, vectors[m]) / np.linalg.norm(query)
                             / np.linalg.norm(vectors[m])) for m in members]
        order = sorted(range(len(members)), key=lambda i: literal[i],
                       reverse=metric == "cosine")[:12]
        found = min(12, len(members))
        assert row_positions[:found].tolist() == [int(members[i]) for i in order]
        assert np.allclose(row_scores[:found], [literal[i] for i in order], rtol=1e-4, atol=1e-5)
        assert (row_positions[found:] == -1).all() and np.isnan(row_scores[found:]).all()


def test_an_index_of_an_older_kdml_without_a_centre_is_searched_unshifted(tmp_path):
    """index.json files written before the shift have no 'centre': their vectors were not
    shifted, so neither are the queries."""
    from kdml.evaluation.index import IndexInfo, build_index, load_index, search_index
    from kdml.evaluation.knn import to_search_vectors

    vectors = np.random.default_rng(2).normal(size=(50, 4)).astype(np.float32)
    items = {"labels": np.arange(50), "positions": np.arange(50),
             "sources": np.array([f"v[{i}]" for i in range(50)])}
    build_index(tmp_path / "old", vectors, items,
                IndexInfo("run", "x", "euclidean", 0, "exact", 0, 1.0))
    meta = tmp_path / "old" / "index.json"
    info = json.loads(meta.read_text())
    assert len(info.pop("centre")) == 4
    del info["files_sha256"]  # nor the files' sums, which came later
    del info["values_sha256"]  # nor the sum of its search values, later still
    meta.write_text(json.dumps(info))  # as the older kdml wrote it, with its vectors unshifted
    faiss.write_index(faiss.IndexFlatL2(4), str(tmp_path / "old" / "index.faiss"))
    old_index = faiss.read_index(str(tmp_path / "old" / "index.faiss"))
    old_index.add(to_search_vectors(vectors, 1.0, "euclidean"))
    faiss.write_index(old_index, str(tmp_path / "old" / "index.faiss"))
    distances, positions = search_index(load_index(tmp_path / "old"), vectors[:6] + 0.01, 3)
    exact = ((vectors[:6, None] + 0.01 - vectors[None]) ** 2).sum(-1)
    assert np.array_equal(positions, np.argsort(exact, axis=1)[:, :3])
    assert np.allclose(distances, np.sqrt(np.sort(exact, axis=1)[:, :3]), rtol=1e-4)


def test_a_cosine_index_normalises_each_row_on_its_own(tmp_path):
    """A cosine index's rows are brought to unit norm each on its own: the embeddings' shared
    scale (2^100 for rows of 1e30) had rounded a row of 1e-30 to a float32 zero vector, found
    by no query, where its direction is exactly the query's."""
    from kdml.evaluation.index import IndexInfo, build_index, load_index, search_index

    vectors = np.array([[1e30, 0.0], [0.0, 1e30], [1e-30, 1e-30]], dtype=np.float32)
    items = {"labels": np.arange(3), "positions": np.arange(3),
             "sources": np.array([f"v[{i}]" for i in range(3)])}
    build_index(tmp_path / "index", vectors, items,
                IndexInfo("run", "x", "cosine", 0, "exact", 0, 1.0))
    scores, positions = search_index(load_index(tmp_path / "index"), np.ones((1, 2)), 1)
    assert positions.tolist() == [[2]]
    assert scores[0, 0] == pytest.approx(1.0)


def test_the_retrieval_plot_and_index_search_a_gallery_where_the_split_has_one(tmp_path,
                                                                              monkeypatch,
                                                                              capsys):
    """In-Shop's queries are searched in its gallery, as its metrics are (they had been searched
    among the other queries). Each of the 3 test items has one gallery image here, so with
    k = 3 every row shows the whole gallery, once, and exactly one hit."""
    from fixtures_photo_sets import make_inshop

    from kdml.inspection import plots

    root = make_inshop(tmp_path / "inshop", items=6, per_item=3)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "inshop", "--data-root", root, "--out", run,
                *TINY, "data.batch_size=4", "data.resize=36", "data.image_size=32",
                "eval.ks=[1,2]") == 0
    drawn = {}

    def grid(queries, neighbours, hits, image, path, titles, gallery=None):
        gallery_image, gallery_titles = gallery
        assert len(queries) == 6 and neighbours.shape == (6, 3)  # 2 queries per test item
        for query, row, marks in zip(queries, neighbours, hits, strict=True):
            assert sorted(row.tolist()) == [0, 1, 2]
            assert marks.tolist() == [gallery_titles(int(p)) == titles(int(query)) for p in row]
            assert gallery_image(int(row[0])).shape[-2:] == image(int(query)).shape[-2:]
        drawn["hits"] = hits.sum(axis=1).tolist()
        drawn["rows"] = {int(query): row.tolist() for query, row in zip(queries, neighbours,
                                                                        strict=True)}
        return path

    monkeypatch.setattr(plots, "plot_retrieval_grid", grid)
    capsys.readouterr()
    assert kdml("plot", "retrieval", run, "--queries", "8", "-k", "5") == 0
    rows = drawn.pop("rows")
    assert drawn == {"hits": [1] * 6}
    # fewer queries and neighbours than asked for are said, not drawn without a word
    err = capsys.readouterr().err
    assert ("kdml: warning: the retrieval grid shows 6 queries, not 8: only 6 test samples "
            "have another of their class to retrieve") in err
    assert ("kdml: warning: the retrieval grid shows 3 neighbours per query, not 5: the "
            "gallery holds only 3 images") in err
    # each row in the order of the run's metric (cosine), as its Recall@K ranks the gallery:
    # the same with every embedding lengthened by its own factor, which cosine ignores
    monkeypatch.setattr(plots, "embed_dataset", lengthened_embeddings)
    assert kdml("plot", "retrieval", run, "--queries", "8", "-k", "3") == 0
    assert drawn.pop("rows") == rows
    # kdml index builds what queries search: the gallery (3 images), unless told the part
    for split, count in ((None, 3), ("test", 6)):
        folder = tmp_path / f"index-{split}"
        assert kdml("index", run, "--out", folder, *(["--split", split] if split else [])) == 0
        assert json.loads((folder / "index.json").read_text())["count"] == count
    # --dataset with --data-root reads that root, not the run's own data
    other = make_inshop(tmp_path / "other", items=8, per_item=3)
    assert kdml("embed", run, "--dataset", "inshop", "--data-root", other, "--out",
                tmp_path / "other.npz") == 0
    assert len(np.load(tmp_path / "other.npz")["labels"]) == 8  # its 4 test items' queries


def test_embeddings_of_another_model_are_refused_as_queries(runs, built, tmp_path, capsys):
    """An .npz of `kdml embed` names its checkpoint; searched in another run, it had printed
    meaningless neighbours with exit 0. Its own run takes it, as does an .npz of the user's
    (which names no checkpoint)."""
    other = tmp_path / "other"
    assert kdml("train", "amsoftmax", "--dataset", "digits", "--out", other, *TINY,
                "--seed", "1") == 0
    assert kdml("index", other, "--out", tmp_path / "index") == 0
    shutil.copy(built / "plain.npz", tmp_path / "plain.npz")
    capsys.readouterr()
    assert kdml("search", other, "--index", tmp_path / "index", "--query",
                tmp_path / "plain.npz") == 2
    assert (f"query {tmp_path / 'plain.npz'} holds embeddings of another checkpoint than this "
            "run's (its checkpoint_sha256 differs)") in capsys.readouterr().err
    assert kdml("embed", other, "--out", tmp_path / "other.npz") == 0
    embeddings = np.load(tmp_path / "plain.npz")["embeddings"][:2]
    np.savez(tmp_path / "mine.npz", embeddings=embeddings)
    for query in ("other.npz", "mine.npz"):
        assert kdml("search", other, "--index", tmp_path / "index", "--query",
                    tmp_path / query, "-k", "2") == 0
    # embeddings of the run's best.pt searched without --best: said so (they had been called
    # another checkpoint's, to be embedded again with --dataset)
    from kdml.evaluation.index import checkpoint_fingerprint

    state = torch.load(other / "checkpoints" / "last.pt", weights_only=False)
    torch.save({**state, "epoch": 0}, other / "checkpoints" / "best.pt")
    np.savez(tmp_path / "best.npz", embeddings=embeddings, checkpoint_sha256=np.array(
        checkpoint_fingerprint(other / "checkpoints" / "best.pt")))
    capsys.readouterr()
    assert kdml("search", other, "--index", tmp_path / "index", "--query",
                tmp_path / "best.npz") == 2
    assert capsys.readouterr().err == (
        f"kdml: error: query {tmp_path / 'best.npz'} holds embeddings of best.pt of this run, "
        "not of last.pt: search with --best, or embed the queries without --best\n")
    # an index of best.pt searched without --best, and one of last.pt with it: the flag to
    # search it with is the one it was built with
    assert kdml("index", other, "--best", "--out", tmp_path / "best-index") == 0
    for index, flags, advice in (("best-index", [], "holds best.pt of this run, not last.pt: "
                                  "search it with --best, or build one of last.pt with "
                                  f"'kdml index {other} --out DIR'"),
                                 ("index", ["--best"], "holds last.pt of this run, not best.pt: "
                                  "search it without --best, or build one of best.pt with "
                                  f"'kdml index {other} --best --out DIR'")):
        capsys.readouterr()
        assert kdml("search", other, *flags, "--index", tmp_path / index, "--query",
                    tmp_path / "mine.npz") == 2
        assert capsys.readouterr().err == f"kdml: error: index {tmp_path / index} {advice}\n"


def test_an_atlas_run_searches_in_shops_gallery_too(tmp_path, monkeypatch):
    """Chart retrieval of In-Shop's queries is in its gallery, as for the other methods (it had
    searched the queries among themselves)."""
    from fixtures_photo_sets import make_inshop

    from kdml.evaluation import evaluator

    seen = {}
    chart_metrics = evaluator.chart_retrieval_metrics

    def recorded(coords, index, labels, **kwargs):
        seen["queries"], seen["gallery"] = len(labels), len(kwargs["reference_labels"])
        return chart_metrics(coords, index, labels, **kwargs)

    monkeypatch.setattr(evaluator, "chart_retrieval_metrics", recorded)
    root = make_inshop(tmp_path / "inshop", items=6, per_item=3)
    assert kdml("train", "mtriplet", "--dataset", "inshop", "--data-root", root, "--out",
                tmp_path / "run", *TINY, "data.batch_size=6", "data.samples_per_class=3",
                "data.resize=36", "data.image_size=32", "eval.ks=[1]",
                "method.n_charts=2") == 0
    assert seen == {"queries": 6, "gallery": 3}


def test_float_inputs_of_any_precision_find_what_float32_ones_find(runs, built, tmp_path, capsys):
    """numpy's default float64 (and float16) 'inputs' are cast to the samples' float32: they
    had stopped the search with torch's 'expected scalar type Double but found Float'."""
    from kdml.data.offline import load_digits

    images, _ = load_digits()
    shutil.copytree(built / "plain-index", tmp_path / "index")
    found = {dtype: searched_sources(runs / "plain", tmp_path, capsys,
                                     inputs=images[:3].numpy().astype(dtype))
             for dtype in (np.float32, np.float64, np.float16)}
    assert found[np.float64] == found[np.float32]
    assert len(found[np.float16]) == 3


def test_float_image_inputs_outside_0_1_are_refused(runs, built, tmp_path, capsys):
    """Images in memory (digits' floats, Fashion-MNIST's uint8) reach the model in [0, 1], so
    0-255 float pixels would be embedded as a glare; features are taken at any scale."""
    from kdml.data.dataset import ArrayDataset
    from kdml.data.offline import load_digits
    from kdml.data.sample_spec import SampleSpec
    from kdml.inspection.queries import _query_inputs

    images, _ = load_digits()
    shutil.copytree(built / "plain-index", tmp_path / "index")
    np.savez(tmp_path / "q.npz", inputs=images[:3].numpy() * 255)
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz") == 2
    err = capsys.readouterr().err
    assert "range from 0 to 255" in err and "in [0, 1]" in err and err.count("\n") == 1
    labels = torch.zeros(4, dtype=torch.long)
    raw = np.full((2, 1, 5, 5), 200.0, dtype=np.float32)
    uint8_images = ArrayDataset("t", "t", torch.zeros(4, 1, 5, 5, dtype=torch.uint8), labels)
    with pytest.raises(KdmlError, match="range from 200 to 200"):
        _query_inputs(raw, SampleSpec.of(uint8_images, 1), tmp_path / "q.npz")
    with pytest.raises(KdmlError, match="range from -1 to 0,"):  # below 0: [-1, 1] images
        _query_inputs(np.linspace(-1, 0, 50, dtype=np.float32).reshape(2, 1, 5, 5),
                      SampleSpec.of(uint8_images, 1), tmp_path / "q.npz")
    features = ArrayDataset("t", "t", torch.rand(4, 5) * 9 - 3, labels)
    assert _query_inputs(raw[:, 0, 0], SampleSpec.of(features, 1), tmp_path / "q.npz").max() == 200
    # uint8 features are features too: the pipeline, which scales uint8 to [0, 1], had made
    # a feature 200 into 0.78; uint8 images stay uint8, for the pipeline to scale
    features_as_uint8 = _query_inputs(raw[:, 0, 0].astype(np.uint8), SampleSpec.of(features, 1),
                                      tmp_path / "q.npz")
    assert features_as_uint8.dtype == torch.float32 and features_as_uint8.max() == 200
    assert _query_inputs(raw.astype(np.uint8), SampleSpec.of(uint8_images, 1),
                         tmp_path / "q.npz").dtype == torch.uint8


def test_a_validated_run_is_inspected_on_its_test_part_with_test(tmp_path, capsys,
                                                                  monkeypatch):
    """A run with data.validation calls its validation part "test": embed, index and the plots
    say so on stderr, and --test reaches the test part that `kdml eval --test` scores. Another
    dataset (--dataset), which the run never saw, gives its own test part (with --test too it
    is refused, as by eval); --split train with --test is refused (it would count the
    validation classes as trained on)."""
    from kdml.inspection import plots

    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "digits", "--out", run, *TINY,
                "data.validation=0.4") == 0
    parts = {}
    for name, test in (("validation", []), ("test", ["--test"])):
        for other in ([], ["--dataset", "digits"]):
            if test and other:
                continue
            out = tmp_path / f"{name}{len(other)}.npz"
            capsys.readouterr()
            assert kdml("embed", run, "--out", out, *test, *other) == 0
            noted = "validation part (364 samples" in capsys.readouterr().err
            assert noted == (not test and not other)
            parts[name, len(other)] = sorted(set(np.load(out)["labels"].tolist()))
    assert parts == {("validation", 0): [3, 4], ("validation", 2): [5, 6, 7, 8, 9],
                     ("test", 0): [5, 6, 7, 8, 9]}
    assert kdml("embed", run, "--test", "--dataset", "digits", "--out", tmp_path / "o.npz") == 2
    assert "with --dataset that dataset's own parts are read" in capsys.readouterr().err
    assert kdml("embed", run, "--split", "train", "--test", "--out", tmp_path / "t.npz") == 2
    assert "with --split train it would add the validation classes" in capsys.readouterr().err
    assert kdml("index", run, "--test", "--out", tmp_path / "index") == 0
    assert json.loads((tmp_path / "index" / "index.json").read_text())["count"] == 896
    mapped = []
    monkeypatch.setattr(plots, "embedding_map", unmapped)  # which part is mapped is checked
    monkeypatch.setattr(plots, "plot_embedding_map",
                        lambda coordinates, labels, path, method, title, *_:
                        mapped.append((set(labels), title)) or path)
    monkeypatch.setattr(plots, "plot_retrieval_grid",
                        lambda queries, neighbours, hits, image, path, *_, **__: path)
    for test in ([], ["--test"]):
        capsys.readouterr()
        assert kdml("plot", "embedding", run, "--max-points", "300", *test) == 0
        assert ("validation part" in capsys.readouterr().err) == (not test)
        assert kdml("plot", "retrieval", run, *test) == 0
        assert ("validation part" in capsys.readouterr().err) == (not test)
    # the picture says which part it shows, as stderr did
    assert mapped == [({3, 4}, "amsoftmax on digits, validation part"),
                      ({5, 6, 7, 8, 9}, "amsoftmax on digits")]
    # analyze generalization took the validation part as its unseen classes without a word
    capsys.readouterr()
    assert kdml("analyze", "generalization", run, "--repeats", "2") == 0
    assert ("its unseen classes here are the validation part (364 samples of the classes held "
            "out of its training classes to choose its epoch); the test part is not used") in (
        capsys.readouterr().err)  # not "of training classes it did not train on"
    assert json.loads((run / "generalization.json").read_text())["unseen"] == "validation"


@pytest.mark.parametrize("charts", [None, 3])
def test_an_hnsw_index_finds_nearly_all_exact_neighbours(tmp_path, charts):
    """faiss's default HNSW candidate list (16) found 94% of the exact 10 and 82% of the exact
    100 neighbours of 2,500 embeddings; each search keeps max(64, 2k), per chart too. With
    faiss.contrib.torch_utils imported (PML imports it), whose search() takes no
    SearchParameters."""
    import faiss.contrib.torch_utils  # noqa: F401

    from kdml.evaluation.index import (
        IndexInfo,
        build_index,
        hnsw_candidates,
        load_index,
        search_index,
    )

    assert [hnsw_candidates(k) for k in (1, 32, 33, 100)] == [64, 64, 66, 200]  # max(64, 2k)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(2000, 16)).astype(np.float32)
    queries = rng.normal(size=(100, 16)).astype(np.float32)
    chart_of = None if charts is None else rng.integers(0, charts, len(vectors))
    query_charts = None if charts is None else rng.integers(0, charts, len(queries))
    items = {"labels": np.arange(2000), "positions": np.arange(2000),
             "sources": np.array([f"v[{i}]" for i in range(2000)])}
    for kind in ("hnsw", "exact"):
        build_index(tmp_path / kind, vectors, items,
                    IndexInfo("run", "x", "euclidean", 0, kind, 0, 1.0), chart_of)
    for k in (10, 100):
        found = [search_index(load_index(tmp_path / kind), queries, k, query_charts)[1]
                 for kind in ("hnsw", "exact")]
        recall = np.mean([len(set(row) & set(true)) / k for row, true in zip(*found,
                                                                            strict=True)])
        assert recall >= 0.99, (k, recall)


def test_search_names_its_scores_similarities_or_distances(runs, built, tmp_path, capsys):
    """Cosine runs score similarities (higher is nearer), Atlas runs Euclidean distances in
    their charts (lower is nearer): the table's column and --json's metric say which."""
    for run, metric, column in (("plain", "cosine", "similarity"),
                                ("atlas", "euclidean", "distance")):
        shutil.copytree(built / f"{run}-index", tmp_path / run)
        shutil.copy(built / f"{run}.npz", tmp_path / f"{run}.npz")
        query = ["search", runs / run, "--index", tmp_path / run, "--query",
                 tmp_path / f"{run}.npz", "-k", "2"]
        capsys.readouterr()
        assert kdml(*query) == 0
        assert f"  rank  {column:>10}   label  source" in capsys.readouterr().out
        assert kdml(*query, "--json") == 0
        results = json.loads(capsys.readouterr().out)
        assert {result["metric"] for result in results} == {metric}
        assert all("score" in item for item in results[0]["neighbours"])


def test_an_index_of_an_earlier_checkpoint_of_the_run_says_so(runs, tmp_path, capsys):
    """A run trained on after `kdml index` had its index refused as "built from another
    checkpoint", as if of another run: it names this run's checkpoints and the fix."""
    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    assert kdml("index", run, "--out", tmp_path / "index") == 0
    np.savez(tmp_path / "q.npz", embeddings=np.ones((1, 8), dtype=np.float32))
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    torch.save({**state, "epoch": 2}, run / "checkpoints" / "last.pt")  # as trained on
    capsys.readouterr()
    assert kdml("search", run, "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz") == 2
    assert capsys.readouterr().err == (
        f"kdml: error: index {tmp_path / 'index'} was built from another checkpoint of this "
        "run (last.pt at epoch 1; this search reads last.pt at epoch 2); build it again with "
        f"'kdml index {run} --out DIR'\n")


@pytest.mark.parametrize(("edit", "words"), [
    ({"dim": 10}, "index.json says dim 10, its faiss files hold 8-d vectors"),
    ({"metric": "manhattan"}, "index.json's metric is 'manhattan', not one of cosine, "
     "euclidean"),
    ({"metric": "euclidean"}, "index.json says metric 'euclidean', its faiss files another"),
    ({"kind": "flat"}, "index.json's kind is 'flat', not one of exact, ivf, hnsw"),
    ({"scale": -1}, "index.json's scale is -1, not a positive number"),
    ({"scale": True}, "index.json's scale is True, not a positive number"),
    ({"dim": "8"}, "index.json's dim is '8', not a whole number"),
    ({"centre": [0.0]}, "index.json's centre is not a list of 8 finite numbers"),
    ({"centre": ["a"] * 8}, "index.json's centre is not a list of 8 finite numbers"),
    ({"centre": [None] * 8}, "index.json's centre is not a list of 8 finite numbers"),
    ({"run": 3}, "index.json's run and checkpoint_sha256 must be text"),
    ({"checkpoint_sha256": 3}, "index.json's run and checkpoint_sha256 must be text"),
])
def test_an_index_json_that_disagrees_with_its_faiss_files_is_refused(runs, built, tmp_path,
                                                                     capsys, edit, words):
    """A hand-edited index.json had crashed faiss (dim) or been searched as Euclidean
    (an unknown metric)."""
    shutil.copytree(built / "plain-index", tmp_path / "index")  # edited below
    meta = tmp_path / "index" / "index.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), **edit}))
    assert refused_search(runs / "plain", tmp_path, capsys) == damaged_index(tmp_path, words)


@pytest.mark.parametrize("count", [float, str, lambda n: -1, lambda n: True],
                         ids=["float", "text", "negative", "bool"])
def test_an_index_json_count_that_is_not_a_whole_number_is_refused(runs, built, tmp_path,
                                                                    capsys, count):
    """A hand-edited count of 896.0 passed the length checks and crashed numpy with a raw
    TypeError once -k reached it."""
    shutil.copytree(built / "plain-index", tmp_path / "index")  # edited below
    meta = tmp_path / "index" / "index.json"
    info = json.loads(meta.read_text())
    edited = count(info["count"])
    meta.write_text(json.dumps({**info, "count": edited}))
    assert refused_search(runs / "plain", tmp_path, capsys, "-k", 1000) == damaged_index(
        tmp_path, f"index.json's count is {edited!r}, not a whole number")


def test_queries_are_searched_without_the_run_s_data(tmp_path, capsys):
    """A search away from the data (another machine, a dataset moved) had stopped at reading
    the data: an .npz of `kdml embed` is searched with the run's config and checkpoint alone,
    and images and raw 'inputs' are embedded by the model rebuilt from the run folder
    (data.json records what it takes), to the same neighbours as with the data. Every check of
    the query and the index holds without it. A run whose data.json predates that record
    rebuilds its model from its data, where it was or where --data-root says it is now."""
    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=32)
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", run, *TINY,
                "data.batch_size=4", "data.resize=36", "data.image_size=32",
                "eval.ks=[1,2]") == 0
    index = tmp_path / "index"
    assert kdml("index", run, "--out", index) == 0
    assert kdml("embed", run, "--out", tmp_path / "test.npz") == 0
    image = sorted((folder / "c03").iterdir())[0]
    np.savez(tmp_path / "raw.npz", inputs=np.zeros((2, 3, 36, 36), dtype=np.uint8))
    np.savez(tmp_path / "wide.npz", embeddings=np.ones((1, 5), dtype=np.float32))
    stranger = dict(np.load(tmp_path / "test.npz"))
    np.savez(tmp_path / "stranger.npz", **{**stranger, "checkpoint_sha256": np.array("0" * 64)})

    def search(query, *flags):
        capsys.readouterr()
        code = kdml("search", run, "--index", index, "--query", query, "-k", "3", *flags)
        out, err = capsys.readouterr()
        return code, out, err

    queries = (tmp_path / "test.npz", tmp_path / "raw.npz", folder / "c03" / image.name)
    with_data = [search(query) for query in queries]
    moved = tmp_path / "moved"
    folder.rename(moved)
    image_query = moved / "c03" / image.name
    assert [search(query) for query in (*queries[:2], image_query)] == with_data
    assert all(code == 0 for code, _, _ in with_data) and "c03" in with_data[0][1]
    for query, words in (("wide.npz", "dimension 5"),
                         ("stranger.npz", "holds embeddings of another checkpoint")):
        code, _, err = search(tmp_path / query)
        assert code == 2 and words in err and err.count("\n") == 1, err
    # an index of another checkpoint of this run: refused with the epochs of both, or, where
    # they are the same, as of another last.pt at that epoch (the two sides had read the same)
    other = tmp_path / "other-index"
    shutil.copytree(index, other)
    meta = other / "index.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "checkpoint_sha256": "0"}))
    code, _, err = search(tmp_path / "test.npz", "--index", other)
    assert code == 2 and err.startswith(
        f"kdml: error: index {other} was built from another last.pt at epoch 1 of this run "
        "than the one there now (trained again since, or replaced); build it again with "), err
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "epoch": 3}))
    code, _, err = search(tmp_path / "test.npz", "--index", other)
    assert code == 2 and "another checkpoint of this run (last.pt at epoch 3; this search " \
        "reads last.pt at epoch 1)" in err
    # a data.json without the record: the model is rebuilt from the data, where it was, or
    # where --data-root says it is now
    record = run / "data.json"
    record.write_text(json.dumps({key: value for key, value in json.loads(
        record.read_text()).items() if key != "model_input"}))
    for query, found in zip((queries[1], image_query), with_data[1:], strict=True):
        code, _, err = search(query)
        assert code == 2 and err.count("\n") == 1, err
        assert err.endswith(f"config.yaml names folder:{folder}, whose folder does not "
                            "exist now; point --data-root at the data the run trained on\n")
        assert search(query, "--data-root", moved)[:2] == found[:2]
    (run / "checkpoints" / "last.pt").unlink()
    code, _, err = search(tmp_path / "test.npz")
    assert code == 2 and "no checkpoint at" in err and err.count("\n") == 1, err


def test_chart_codes_are_searched_without_reading_the_data(runs, built, tmp_path, capsys,
                                                           monkeypatch):
    """An Atlas run's chart codes are searched, and their charts checked against the run's
    n_charts, without the data; its raw 'inputs' are embedded, into the same charts and
    neighbours, by the model rebuilt from the run folder, without the data too."""
    from kdml.training import loading, trainer

    shutil.copytree(built / "atlas-index", tmp_path / "index")
    shutil.copy(built / "atlas.npz", tmp_path / "codes.npz")
    codes = np.load(tmp_path / "codes.npz")
    coords, charts = codes["chart_coords"][:4], codes["chart_index"][:4]
    np.savez(tmp_path / "q.npz", chart_coords=coords, chart_index=charts)
    np.savez(tmp_path / "chart-5.npz", chart_coords=coords, chart_index=np.array([0, 5, 1, 0]))
    np.savez(tmp_path / "raw.npz", inputs=np.zeros((2, 1, 8, 8), dtype=np.float32))

    def search(query):
        capsys.readouterr()
        code = kdml("search", runs / "atlas", "--index", tmp_path / "index", "--query",
                    tmp_path / query, "-k", "3", "--json")
        out, err = capsys.readouterr()
        return code, out, err

    with_data = search("q.npz"), search("raw.npz")

    def unread(*args, **kwargs):
        raise KdmlError("the data was read")

    monkeypatch.setattr(trainer, "prepare_data_and_test_part", unread)
    monkeypatch.setattr(loading, "prepare_data_and_test_part", unread)
    assert (search("q.npz"), search("raw.npz")) == with_data
    assert [code for code, _, _ in with_data] == [0, 0]
    code, _, err = search("chart-5.npz")
    assert code == 2 and "chart_index[1] is 5, but the run has charts 0 to 2" in err, err


def test_the_search_table_lines_up_class_names_in_wide_characters(monkeypatch, capsys,
                                                                   tmp_path):
    """Padded by len(), a class named in Chinese (two terminal columns a character) pushed its
    row's source column out of line with the others', and so did one with an accent stored
    decomposed (macOS folder names: "e" and a combining acute, two characters, one column)."""
    from kdml.inspection import search

    names = ["猫", "Black footed Albatross", "東京タワー", "Cafe\u0301 cre\u0300me"]
    neighbours = [{"rank": rank, "score": 0.5, "label": rank, "class_name": name,
                   "source": f"img{rank}.jpg"} for rank, name in enumerate(names, 1)]
    monkeypatch.setattr(search, "run_without_data", lambda *args: None)
    monkeypatch.setattr(search, "search", lambda *args: [
        {"query": "q.jpg", "metric": "cosine", "neighbours": neighbours}])
    assert cli.main(["search", str(tmp_path), "--index", "index", "--query", "q.jpg",
                     "-k", "4"]) == 0  # the run folder is there; what is read of it stubbed
    rows = [line for line in capsys.readouterr().out.splitlines() if line.endswith(".jpg")]
    width = cli.evaluate._columns
    columns = [width(row[: row.index("img")]) for row in rows]
    assert len(rows) == 4 and len(set(columns)) == 1, rows
    assert width("東京タワー") == 10 and width("Albatross") == 9
    assert width("Cafe\u0301") == 4 and width("a\u200db") == 2  # + a joiner


def test_a_file_name_with_a_newline_keeps_its_search_row_on_one_line(monkeypatch, capsys,
                                                                      tmp_path):
    """A newline in an image's name (or its class folder's, or the query's) had broken its
    row of the search table in two, the second half ("break.jpg") standing as a row of its
    own; a tab had pushed the column out of line. Control characters are printed escaped, as
    Python writes them; --json keeps the names as they are."""
    from kdml.inspection import search

    neighbours = [{"rank": rank, "score": 0.5, "label": rank, "class_name": name,
                   "source": f"photos/{source}"} for rank, (name, source) in enumerate(
                       (("cats\nand dogs", "line\nbreak.jpg"), ("cats", "tab\there.jpg")), 1)]
    monkeypatch.setattr(search, "run_without_data", lambda *args: None)
    monkeypatch.setattr(search, "search", lambda *args: [
        {"query": "q\r.jpg", "metric": "cosine", "neighbours": neighbours}])
    assert cli.main(["search", str(tmp_path), "--index", "index", "--query", "q.jpg",
                     "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "query q\\r.jpg:"
    assert lines[2] == "     1      0.5000       1  cats\\nand dogs  photos/line\\nbreak.jpg"
    assert lines[3] == "     2      0.5000       2  cats            photos/tab\\there.jpg"
    assert len(lines) == 4
    assert cli.main(["search", str(tmp_path), "--index", "index", "--query", "q.jpg",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["neighbours"] == neighbours


def test_a_retrieval_grid_leaves_a_neighbour_that_does_not_exist_empty(tmp_path):
    """-1: an Atlas query whose chart holds fewer images than the grid's columns."""
    from kdml.viz_retrieval import plot_retrieval_grid

    loaded = []

    def image(position: int) -> torch.Tensor:
        assert position >= 0
        loaded.append(position)
        return torch.full((8, 8), position / 10)

    path = plot_retrieval_grid(np.array([0, 1]), np.array([[2, 3], [4, -1]]),
                               np.array([[True, False], [True, False]]), image,
                               tmp_path / "grid.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(loaded) == [0, 1, 2, 3, 4]


def test_a_retrieval_grid_draws_and_captions_the_neighbours_from_the_gallery():
    """With a gallery (In-Shop), the queries are loaded and captioned from the query set and
    their neighbours, positions of the gallery, from the gallery; each neighbour is captioned
    with its rank and framed green (a hit) or red (a miss); -1 is left empty."""
    from matplotlib.colors import to_hex

    from kdml.viz_retrieval import HIT, MISS, _retrieval_grid_figure

    loaded = {"query set": [], "gallery": []}

    def loader(name):
        def image(position: int) -> torch.Tensor:
            loaded[name].append(position)
            return torch.full((8, 8), 0.5)
        return image

    figure = _retrieval_grid_figure(
        np.array([0, 1]), np.array([[2, 3], [4, -1]]), np.array([[True, False], [False, False]]),
        (loader("query set"), lambda position: f"q{position}"),
        (loader("gallery"), lambda position: f"g{position}"))
    assert loaded == {"query set": [0, 1], "gallery": [2, 3, 4]}
    drawn = [axes for axes in figure.axes if axes.get_title()]
    assert [axes.get_title() for axes in drawn] == ["query: q0", "1: g2", "2: g3", "query: q1",
                                                    "1: g4"]
    assert [to_hex(axes.spines["top"].get_edgecolor()) for axes in drawn] == [
        "#000000", HIT, MISS, "#000000", MISS]


@pytest.mark.parametrize("target_classes", [range(5, 10), range(5)], ids=["5-9", "0-4"])
def test_unlabelled_target_samples_are_no_class_to_the_analysis_or_the_map(tmp_path, capsys,
                                                                           monkeypatch,
                                                                           target_classes):
    """An npz: domain pair's target rows of label -1 had been a class "-1" to lambda's
    classifiers (0.53 on data where the same rows dropped give 0.00) and in the map's legend
    and class count. A target class 0 is a class like any other (not unlabelled), and the
    seen classes keep their own labels, which the training split numbers from 0 too."""
    from kdml.inspection import plots
    from kdml.viz_retrieval import _embedding_map_figure

    rng = np.random.default_rng(0)
    truth = np.tile(np.arange(10), 20)
    x = 0.1 * rng.standard_normal((200, 8))
    x[np.arange(200), truth % 8] += 5 + truth // 8 * 5
    domain = np.where(np.isin(truth, target_classes), "target", "source")
    labels = truth.copy()
    labels[np.flatnonzero(domain == "target")[::2]] = -1  # half the target unlabelled
    np.savez(tmp_path / "pair.npz", X=x, y=labels, domain=domain)
    run = tmp_path / "run"
    assert kdml("train", "pca", "--dataset", f"npz:{tmp_path / 'pair.npz'}", "--out", run,
                "--no-progress") == 0
    capsys.readouterr()
    assert kdml("analyze", "generalization", run, "--repeats", "3") == 0
    assert ("kdml: warning: 50 unlabelled samples (label -1) of the unseen classes are left "
            "out of the H-divergence and lambda") in capsys.readouterr().err
    written = json.loads((run / "generalization.json").read_text())
    assert written["lambda"]["mean"] == 0.0  # five well-separated classes on each side
    drawn = {}
    monkeypatch.setattr(plots, "embedding_map", unmapped)  # the mapped labels are checked
    monkeypatch.setattr(plots, "plot_embedding_map",
                        lambda coordinates, labels, path, method, title, class_names=None, *_:
                        drawn.update(labels=labels) or path)
    assert kdml("plot", "embedding", run) == 0
    figure = _embedding_map_figure(np.zeros((len(drawn["labels"]), 2)), drawn["labels"], "PCA",
                                   "pca", None)
    (axes,) = figure.axes
    assert axes.get_title() == "pca (PCA, 5 classes)"
    assert [text.get_text() for text in axes.get_legend().get_texts()] == [
        "unlabelled", *map(str, target_classes)]


def test_search_refuses_a_data_root_its_run_does_not_read(runs, built, tmp_path, capsys):
    """A query of embeddings needs no data, so --data-root had been ignored without a word on
    a digits run, where eval, embed and analyze refuse it."""
    shutil.copytree(built / "plain-index", tmp_path / "index")
    np.savez(tmp_path / "q.npz", embeddings=np.ones((2, 8), dtype=np.float32))
    capsys.readouterr()
    assert kdml("search", runs / "plain", "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz", "--data-root", tmp_path / "nowhere") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: --data-root {tmp_path / 'nowhere'} (data.root) is read "
                          "only by the on-disk formats") and "digits does not use it" in err


@pytest.mark.parametrize("edit, said", [
    ("split: standard", "this run's split (data.split=seen-holdout) tests on its training "
     "classes; the analysis needs unseen classes: a run with data.split=class-disjoint"),
    ("dataset: digits", "this run's data (digits->mnist5k) is a domain pair, whose target "
     "shares the source's classes; the analysis needs unseen classes: a class-disjoint split "
     "of one dataset"),
])
def test_analyze_refuses_overlapping_classes_before_loading_the_run(runs, tmp_path, capsys,
                                                                    monkeypatch, edit, said):
    """A seen-holdout run's test classes are its training classes, as a domain pair's target
    shares its source's: the analysis had embedded both parts (minutes on a large dataset)
    before refusing them, and then loaded the run's data and model first; refused now from
    config.yaml, naming the split. (The plain run's config.yaml edited to each: the check
    reads nothing else.)"""
    from kdml.training import loading

    run = tmp_path / "run"
    shutil.copytree(runs / "plain", run)
    config = run / "config.yaml"
    changed = {"split: standard": "split: seen-holdout",
               "dataset: digits": "dataset: digits->mnist5k"}[edit]
    assert config.read_text().count(f"  {edit}\n") == 1
    config.write_text(config.read_text().replace(f"  {edit}\n", f"  {changed}\n"))

    def no_loading(*args, **kwargs):
        raise AssertionError("loaded the run before refusing it")

    monkeypatch.setattr(loading, "load_run", no_loading)
    assert kdml("analyze", "generalization", run) == 2
    assert capsys.readouterr().err == f"kdml: error: {said}\n"
    assert not (run / "generalization.json").exists()


def test_an_atlas_search_lists_only_the_items_of_the_query_s_chart(runs, built, tmp_path, capsys):
    """A chart holds fewer items than -k: the search's empty places (-1) are left out, never
    listed as the index's last item at a NaN score (which --json writes as NaN, no JSON)."""
    shutil.copytree(built / "atlas-index", tmp_path / "index")
    shutil.copy(built / "atlas.npz", tmp_path / "codes.npz")
    codes = np.load(tmp_path / "codes.npz")
    np.savez(tmp_path / "q.npz", chart_coords=codes["chart_coords"][:6],
             chart_index=codes["chart_index"][:6])
    capsys.readouterr()
    assert kdml("search", runs / "atlas", "--index", tmp_path / "index", "--query",
                tmp_path / "q.npz", "-k", "896", "--json") == 0
    results = json.loads(capsys.readouterr().out)
    members = np.bincount(codes["chart_index"], minlength=3)
    assert members.max() < 896  # every chart holds fewer than -k
    for chart, result in zip(codes["chart_index"][:6], results, strict=True):
        assert len(result["neighbours"]) == members[chart]
        assert all(math.isfinite(item["score"]) for item in result["neighbours"])


def test_embed_refuses_an_out_that_is_no_new_npz_before_embedding(runs, tmp_path, capsys,
                                                                   monkeypatch):
    """--out must name a new .npz: another suffix, or a file that exists (the user's), is
    refused in one line before the run is embedded, and the file is left as it was."""
    from kdml.inspection import parts

    def unembedded(*args, **kwargs):
        raise AssertionError("embedded before --out was checked")

    monkeypatch.setattr(parts, "embed_dataset", unembedded)
    taken = tmp_path / "taken.npz"
    taken.write_bytes(b"the user's")
    for out, words in ((tmp_path / "e.txt", f"--out {tmp_path / 'e.txt'} must end in .npz"),
                       (taken, f"{taken} exists; kdml does not overwrite files: choose "
                               "another --out")):
        capsys.readouterr()
        assert kdml("embed", runs / "plain", "--out", out) == 2
        assert capsys.readouterr().err == f"kdml: error: {words}\n"
    assert taken.read_bytes() == b"the user's" and not (tmp_path / "e.txt").exists()


def test_search_with_best_embeds_raw_queries_with_best_pt(runs, tmp_path, capsys, monkeypatch):
    """`kdml search --best` of raw 'inputs' embeds them with the model of best.pt, whose
    index it searches (last.pt's model had embedded them, without a word)."""
    from kdml.training import loading

    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    torch.save({**state, "epoch": 0}, run / "checkpoints" / "best.pt")
    assert kdml("index", run, "--best", "--out", tmp_path / "index") == 0
    np.savez(tmp_path / "raw.npz", inputs=np.zeros((2, 1, 8, 8), dtype=np.float32))
    loaded = []
    load_model = loading.load_model

    def recorded(*args, **kwargs):
        model = load_model(*args, **kwargs)
        loaded.append((model.checkpoint.name, model.epoch))
        return model

    monkeypatch.setattr(loading, "load_model", recorded)
    assert kdml("search", run, "--best", "--index", tmp_path / "index", "--query",
                tmp_path / "raw.npz", "-k", "2") == 0
    assert loaded == [("best.pt", 0)]


def test_analyze_estimates_with_the_settings_it_is_given_and_records(runs, tmp_path, capsys,
                                                                     monkeypatch):
    """--labelled-fraction, --repeats, --neighbors and --seed all reach the estimate, and
    generalization.json records the settings it was made with."""
    from kdml.inspection import analysis

    asked = []
    terms = analysis.generalization_terms

    def recorded(*args, **kwargs):
        asked.append(kwargs)
        return terms(*args, **kwargs)

    monkeypatch.setattr(analysis, "generalization_terms", recorded)
    run = tmp_path / "plain"
    shutil.copytree(runs / "plain", run)
    assert kdml("analyze", "generalization", run, "--labelled-fraction", "0.4", "--repeats",
                "3", "--neighbors", "2", "--seed", "7") == 0
    settings = {"labelled_fraction": 0.4, "repeats": 3, "neighbors": 2, "seed": 7}
    assert asked == [settings]
    written = json.loads((run / "generalization.json").read_text())["settings"]
    assert written == {**settings, "epoch": 1}


def test_an_atlas_run_is_indexed_by_the_euclidean_distance_of_its_charts_whatever_its_metric(
        runs, tmp_path, capsys):
    """An Atlas run's index holds chart coordinates, ranked by their Euclidean distance as its
    metrics rank them, also where its config says eval.metric: cosine."""
    run = tmp_path / "atlas"
    shutil.copytree(runs / "atlas", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["eval"]["metric"] = "cosine"
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    capsys.readouterr()
    assert kdml("index", run, "--out", tmp_path / "index") == 0
    assert capsys.readouterr().out.startswith("exact euclidean index of 896 2-d vectors, ")
    assert json.loads((tmp_path / "index" / "index.json").read_text())["metric"] == "euclidean"
