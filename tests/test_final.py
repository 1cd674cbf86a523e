"""study.final end to end: MLflow records, the pyfunc model, and bad input (exit 2, nothing left RUNNING)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import runpy
import signal
import sqlite3
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from study.final import cli as final
from study.final import placement as seeds
from study.final import train as final_train
from study.final.plan import make_plan
from study.final.results import ConfigurationResult, EnsembleResult, FinalResult, SeedResult, summarize
from study.final.run import print_summary
from study.final.train import load_data, placement_of
from study.launch.settings import study_settings
from tests.conftest import ROOT, omniglot_root, wait_for
from trainables.core.config import ConfigError, TrainConfig

TINY = {
    "dataset": "synthetic",
    "epochs": 2,
    "classes_per_batch": 8,
    "samples_per_class": 2,
    "embedding_dim": 16,
    "heating": "two_stage",
    "normalization": "bn",
    "alpha": 16.0,
    "heating_target": 4.0,
}


def write_config(path, **changes):
    path.write_text(yaml.safe_dump({**TINY, **changes}))
    return path


def all_runs(uri):
    client = mlflow.MlflowClient(uri)
    experiments = client.search_experiments()
    return client, client.search_runs([e.experiment_id for e in experiments]) if experiments else []


def test_core_imports_no_ray_optuna_mlflow():
    code = (
        "import sys, trainables.core, trainables.core.engine, trainables.core.metrics, trainables.core.data, "
        "trainables.core.checkpoint; print([m for m in ('ray', 'optuna', 'mlflow') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def loaded_after(code: str, modules: tuple[str, ...]) -> tuple[list[str], object]:
    """Run ``code`` in a fresh interpreter: which of ``modules`` it loaded, and the JSON value of its ``result`` (or None)."""
    script = f"import json, sys\n{code}\nprint(json.dumps([[m for m in {modules!r} if m in sys.modules], globals().get('result')]))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    loaded, result = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded, result


def test_the_drivers_import_no_torch():
    """study.launch, study.report and study.sync start without torch, torchvision, faiss or scikit-learn (6 of a
    driver's 8 s of imports): they read and check datasets, rungs and records; the trials import the engine."""
    code = (
        "import study.launch.cli, study.launch.tuner, study.report.cli, study.sync, study.search.schedulers, "
        "trainables.core.data, trainables.core.budgets"
    )
    assert loaded_after(code, ("torch", "torchvision", "faiss", "sklearn"))[0] == []


def test_a_driver_reads_its_spaces_and_tags_its_runs_without_torch():
    """What a driver does before and beside its trials, checking every shipped space's configs (TrainConfig) and
    tagging its runs with the library versions, loads no torch, torchvision or faiss (2 to 3 s of every driver's CPU)."""
    code = (
        "from study.search import spaces; from study.records import tracking; "
        "[spaces.load_space(p) for p in sorted(spaces.SHIPPED.glob('*.yaml'))]; result = tracking.reproducibility_tags()"
    )
    modules, tags = loaded_after(code, ("torch", "torchvision", "faiss"))
    assert modules == []
    import faiss
    import torchvision

    versions = (torch.__version__, torchvision.__version__, faiss.__version__)  # pip's version may leave out "+cu130"
    tagged = (tags["torch"], tags["torchvision"], tags["faiss"])
    assert [tag.split("+")[0] for tag in tagged] == [v.split("+")[0] for v in versions]


def test_a_trial_worker_imports_no_scikit_learn_and_no_torchvision():
    """The trainable (what every new trial worker imports before its first epoch) leaves scikit-learn and scipy out:
    they took 1.1 to 1.9 s of a worker's start for one NMI per evaluation, which metrics computes itself. Torchvision
    too (its models and ops, 0.4 s of a worker's start: the torch._dynamo they import comes with torch's optimizers
    anyway): only a pretrained backbone and the image-by-image path (photos without a decoded cache, serving) load
    it, when they run; characters train batch-wise without it."""
    assert loaded_after("import trainables.dml", ("sklearn", "scipy", "torchvision"))[0] == []


@pytest.mark.faults
@pytest.mark.slow
def test_seeds_trained_side_by_side_are_recorded_as_one_after_another_even_when_a_worker_dies(tmp_path, runs, capsys, monkeypatch):
    """Two seeds as tasks of a local Ray (study.final.placement); the worker of one dies after reporting its first epoch, as it
    would with its node (the fault injection of study.final.placement). Ray runs that seed again; what is recorded is what one
    seed after another in the driver recorded: a run per seed with one value per epoch, the parent's mean and spread,
    the pictures, each seed's model named embedding-seed<k>, and the seeds as one model, registered."""
    marker = tmp_path / "lost-a-worker"
    monkeypatch.setenv(seeds.FAULT_ENV, str(marker))
    monkeypatch.setattr(seeds, "local_placement", lambda cores, n, device: seeds.Placement(parallel=True, threads=1, local_cpus=2.0))
    config = write_config(tmp_path / "tiny.yaml")
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    argv = ["--config", str(config), "--seeds", "2", "--tracking-uri", uri, "--experiment", "e", "--register", "tiny-embedding"]
    assert final.main(argv) == 0
    out = capsys.readouterr().out
    assert marker.is_file()  # a worker died mid-seed: without the retry the command would have failed
    assert "side by side as tasks of a local Ray" in out and "epoch   2/2" in out
    assert f"mlflow ui --backend-store-uri {uri}, then open http://127.0.0.1:5000/#/experiments/" in out
    assert "study.report" not in out  # a config file's runs make no study report
    assert_final_records(uri, [0, 1], "tiny-embedding", tmp_path)


def assert_final_records(uri: str, seed_values: list[int], registered: str, tmp_path: Path) -> None:
    """study.final's records of one configuration: the parent FINISHED with the seeds' mean and spread, its config and
    results; a FINISHED child run per seed with one train_loss per epoch, test metrics, pictures and its model
    ``embedding-seed<k>``; the seeds as one model, registered as ``registered``, and it embeds raw images."""
    client, found = all_runs(uri)
    parents = [r for r in found if r.data.tags.get("kind") == "final"]
    seed_runs = sorted((r for r in found if r.data.tags.get("kind") == "final_seed"), key=lambda r: int(r.data.params["seed"]))
    assert len(parents) == 1 and [int(r.data.params["seed"]) for r in seed_runs] == seed_values
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in seed_runs} == {parent.info.run_id}
    models = {m.source_run_id: m for m in client.search_logged_models([parent.info.experiment_id])}
    per_seed = []
    for run in seed_runs:
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert sorted(m.step for m in history) == [1, 2]  # one value per epoch, step = epoch
        assert 0.0 <= run.data.metrics["test_recall_at_1"] <= 1.0
        per_seed.append(run.data.metrics["test_recall_at_1"])
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        seed = run.data.params["seed"]
        assert {f"similarity_histogram_seed{seed}.png", f"retrieval_grid_seed{seed}.png", f"tsne_seed{seed}.png"} <= artifacts
        assert run.data.params["normalization"] == "bn"
        assert models[run.info.run_id].name == f"embedding-seed{seed}"
    # the parent's mean and spread are those of the seeds' test metrics
    assert parent.data.metrics["test_recall_at_1_mean"] == pytest.approx(np.mean(per_seed))
    assert parent.data.metrics["test_recall_at_1_std"] == pytest.approx(np.std(per_seed, ddof=1))
    assert {"config.yaml", "results.json"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    resolved = yaml.safe_load(download(uri, parent.info.run_id, "config.yaml", tmp_path / "dl").read_text())
    assert resolved["embedding_dim"] == 16 and resolved["loss"] == "softmax"
    results = json.loads(download(uri, parent.info.run_id, "results.json", tmp_path / "dl2").read_text())
    first = results["per_seed"][0]
    assert (first["seed"], first["run_id"], first["registered_uri"]) == (seed_values[0], seed_runs[0].info.run_id, None)
    ensemble_run = assert_ensemble_is_the_seeds_side_by_side(uri, parent, seed_runs, models)
    # with two seeds or more the final model is the seeds as one model: that is what is registered
    assert (results["ensemble"]["run_id"], results["ensemble"]["registered_uri"]) == (ensemble_run, f"models:/{registered}/1")
    version = client.get_model_version(registered, "1")
    seeds_named = ", ".join(map(str, seed_values))
    assert version.run_id == ensemble_run and f"seeds {seeds_named} as one model" in version.description
    assert_model_embeds_raw_images(uri, results["ensemble"]["registered_uri"], tmp_path, dim=16 * len(seed_values))


def assert_ensemble_is_the_seeds_side_by_side(uri: str, parent, seed_runs: list, models: dict, dims: list[int] | None = None) -> str:
    """The seeds as one model: a FINISHED child run with the model ``embedding-ensemble``, whose test R@1 is that of the
    mean cosine similarity of the seed models, counted here by a direct loop over the test images; the model embeds an
    image as the seed models' embeddings side by side, scaled by 1/sqrt(seeds): ``dims`` wide each (16 by default).
    A study's parent has the ensemble's metrics with the prefix ``final_``."""
    from trainables.core.data import load_dataset
    from trainables.core.engine import embed

    (run,) = [r for r in all_runs(uri)[1] if r.data.tags.get("kind") == "final_ensemble"]
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert models[run.info.run_id].name == "embedding-ensemble"
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)  # models:/ URIs resolve through it
    try:
        singles = [mlflow.pyfunc.load_model(models[r.info.run_id].model_uri).unwrap_python_model() for r in seed_runs]
        joint = mlflow.pyfunc.load_model(models[run.info.run_id].model_uri).unwrap_python_model()
    finally:
        mlflow.set_tracking_uri(before)
    test = load_dataset("synthetic", None).test
    labels, similarity = np.asarray(test.labels), np.zeros((len(test.labels), len(test.labels)))
    for single in singles:
        ((model, size),) = single.members
        e = embed(model, test, size, torch.device("cpu")).numpy().astype(np.float64)
        e /= np.linalg.norm(e, axis=1, keepdims=True)
        similarity += e @ e.T / len(singles)
    correct = 0
    for i in range(len(labels)):  # the nearest other image by the seeds' mean cosine similarity
        others = [j for j in range(len(labels)) if j != i]
        correct += labels[others[int(np.argmax(similarity[i, others]))]] == labels[i]
    assert run.data.metrics["test_recall_at_1"] == pytest.approx(correct / len(labels))
    prefix = "final_" if parent.data.tags.get("kind") == "study" else ""
    assert parent.data.metrics[f"{prefix}ensemble_test_recall_at_1"] == pytest.approx(correct / len(labels))
    images = omniglot_pngs(3)
    side_by_side = np.concatenate([single.predict(None, images) for single in singles], axis=1) / np.sqrt(len(singles))
    assert joint.predict(None, images).shape == (3, sum(dims or [16] * len(singles)))
    assert joint.predict(None, images[:0]).shape == (0, sum(dims or [16] * len(singles)))
    np.testing.assert_allclose(joint.predict(None, images), side_by_side, atol=1e-6)
    return run.info.run_id


def download(uri: str, run_id: str, name: str, dst: Path) -> Path:
    """A run's artifact ``name``, downloaded into ``dst``."""
    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name, dst_path=str(dst), tracking_uri=uri))


def assert_model_embeds_raw_images(uri: str, model_uri: str, tmp_path: Path, dim: int = 16) -> None:
    """The logged model, loaded in a fresh process, embeds raw uint8 images of any size, ``dim`` wide."""
    images = omniglot_pngs(6)
    np.save(tmp_path / "images.npy", images)
    code = (
        "import mlflow, numpy as np, sys; mlflow.set_tracking_uri(sys.argv[1]); "
        "m = mlflow.pyfunc.load_model(sys.argv[2]); x = np.load(sys.argv[3]); "
        "e = m.predict(x); np.save(sys.argv[4], e); e3 = m.predict(np.repeat(x[..., None], 3, axis=-1)); "
        "print(e.dtype, e.shape, float(np.abs(e - e3).max()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, uri, model_uri, str(tmp_path / "images.npy"), str(tmp_path / "emb.npy")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    dtype, diff = last.split(" ")[0], last.split(" ")[-1]
    embeddings = np.load(tmp_path / "emb.npy")
    assert dtype == "float32" and embeddings.shape == (6, dim)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert float(diff) < 1e-5  # (N, H, W) and (N, H, W, 3) inputs give the same embeddings


def omniglot_pngs(n: int) -> np.ndarray:
    """n raw 105 x 105 Omniglot PNGs as uint8 (N, H, W) (test alphabets), or drawn ones without the data."""
    root = omniglot_root()
    if root is None:
        from trainables.core.data import synthetic_glyphs

        glyphs, _ = synthetic_glyphs(n, 1, 105, seed=3)
        return glyphs
    with zipfile.ZipFile(root / "omniglot" / "images_background_small2.zip") as zf:
        names = sorted(n for n in zf.namelist() if "/Tagalog/" in n and n.endswith(".png"))[:n]
        images = [np.asarray(Image.open(io.BytesIO(zf.read(name))).convert("L"), dtype=np.uint8) for name in names]
    assert images[0].shape == (105, 105)
    return np.stack(images)


def run_main(argv, capsys):
    code = final.main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


BAD_CONFIGS = [
    ({"lossy": 1}, "lossy"),
    ({"alpha": -3}, "alpha"),
    ({"classes_per_batch": 100}, "classes_per_batch"),
    ({"heating_target": 32.0}, "heating_target"),
    ({"loss": "ice", "samples_per_class": 1}, "samples_per_class"),
]


@pytest.mark.parametrize("changes, key", BAD_CONFIGS)
def test_bad_config_is_one_line_exit_2_and_no_run(tmp_path, runs, capsys, changes, key):
    config = write_config(tmp_path / "bad.yaml", **changes)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    code, err = run_main(["--config", str(config), "--tracking-uri", uri], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and key in err and str(config) in err
    assert all_runs(uri)[1] == []


def test_missing_data_root_and_malformed_folders(tmp_path, runs, capsys, monkeypatch):
    monkeypatch.delenv("DML_DATA_ROOT", raising=False)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    config = write_config(tmp_path / "omni.yaml", dataset="omniglot")
    code, err = run_main(["--config", str(config), "--tracking-uri", uri], capsys)
    assert code == 2 and "--data-root" in err
    code, err = run_main(["--config", str(config), "--tracking-uri", uri, "--data-root", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "nowhere" in err
    (tmp_path / "folder" / "train").mkdir(parents=True)
    (tmp_path / "folder" / "test").mkdir()
    config = write_config(tmp_path / "folder.yaml", dataset="folder", image_size=32)
    code, err = run_main(["--config", str(config), "--tracking-uri", uri, "--data-root", str(tmp_path / "folder")], capsys)
    assert code == 2 and "train" in err and len(err.splitlines()) == 1
    assert all_runs(uri)[1] == []


def make_folder_dataset(root, corrupt: bool):
    rng = np.random.default_rng(0)
    for part, classes in (("train", range(6)), ("test", range(6, 9))):
        for c in classes:
            folder = root / part / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    if corrupt:  # every batch of 4 of the 6 classes meets one of these
        for c in range(3):
            (root / "train" / f"class{c}" / "0.png").write_bytes(b"not an image at all")


def test_unreadable_image_mid_training_fails_cleanly(tmp_path, runs, capsys):
    make_folder_dataset(tmp_path / "data", corrupt=True)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    config = write_config(tmp_path / "folder.yaml", dataset="folder", image_size=32, classes_per_batch=4, samples_per_class=3, epochs=1)
    code, err = run_main(["--config", str(config), "--tracking-uri", uri, "--data-root", str(tmp_path / "data"), "--seeds", "1"], capsys)
    assert code == 2
    assert "0.png" in err and "unreadable image" in err and len(err.splitlines()) == 1
    _, found = all_runs(uri)
    assert found and all(r.info.status == "FAILED" for r in found)  # nothing left RUNNING


def test_weights_file_that_does_not_fit_the_backbone(tmp_path, runs, capsys):
    from trainables.core.models import SmallCNN

    weights = tmp_path / "cnn.pt"
    torch.save(SmallCNN(1, image_size=32).state_dict(), weights)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    make_folder_dataset(tmp_path / "data", corrupt=False)
    config = write_config(
        tmp_path / "r18.yaml", dataset="folder", backbone="resnet18", pretrained=str(weights), image_size=32, classes_per_batch=4
    )
    code, err = run_main(["--config", str(config), "--tracking-uri", uri, "--data-root", str(tmp_path / "data")], capsys)
    assert code == 2 and str(weights) in err and "resnet18" in err
    assert all_runs(uri)[1] == []


def run_as_main(argv: list[str], monkeypatch) -> int:
    """``python -m study.final ARGV`` in this interpreter: the module run as ``__main__``, its exit status returned."""
    monkeypatch.setattr(sys, "argv", ["study.final", *argv])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exited:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: study.final is imported already (by this file)
        runpy.run_module("study.final", run_name="__main__", alter_sys=True)
    return exited.value.code


def test_cli_exit_status_is_2(tmp_path, monkeypatch, capsys):
    config = write_config(tmp_path / "bad.yaml", embedding_dim=1)
    assert run_as_main(["--config", str(config), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: ") and "embedding_dim" in err


def test_help_is_actionable(monkeypatch, capsys):
    assert run_as_main(["--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert "--seeds" in out and "--study" in out and "Examples" in out


# -- the plan: the three modes resolved up front, checked cheaply ------------------------------------------------------


def test_plan_of_a_config_file(tmp_path):
    config = write_config(tmp_path / "tiny.yaml")
    args = final.parse_args(["--config", str(config), "--seeds", "2", "--epochs", "1"])
    plan = make_plan(args, "sqlite:///unused.db")
    assert (plan.name, plan.run_name, plan.experiment, plan.source) == ("tiny", "final-tiny", "final", str(config))
    assert [name for name, _ in plan.configurations] == ["tiny"] and plan.configurations[0][1].epochs == 1
    assert not plan.grid and plan.prefix == "" and plan.parent_run_id is None and plan.register is None
    assert plan.seed_values() == [0, 1] and plan.seed_run_name("tiny", 1) == "final-seed1-tiny"


def test_plan_of_a_space_names_each_configuration():
    plan = make_plan(final.parse_args(["--space", "paper_ablation", "--seeds", "3"]), "sqlite:///unused.db")
    assert plan.grid and plan.name == plan.run_name == "paper_ablation" and plan.prefix == ""
    assert [name for name, _ in plan.configurations] == ["SM", "LN", "BN", "HLN", "HBN"]
    assert plan.source_of("HBN") == "paper_ablation (HBN)" and plan.seed_run_name("HBN", 2) == "HBN-seed2"


def test_batch_check_names_the_configuration_without_building_a_model(tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built to check a batch composition")

    monkeypatch.setattr(final_train, "build_model", no_model)
    space = tmp_path / "g.yaml"
    space.write_text(yaml.safe_dump({"fixed": {**TINY, "epochs": 1}, "grid": {"classes_per_batch": [8, 100]}}))
    plan = make_plan(final.parse_args(["--space", str(space)]), "sqlite:///unused.db")
    with pytest.raises(ConfigError, match=r"\(classes_per_batch=100\): classes_per_batch=100 is larger than the \d+ training"):
        load_data(plan, None, download=False)
    plan = make_plan(final.parse_args(["--config", str(write_config(tmp_path / "ok.yaml"))]), "sqlite:///unused.db")
    assert list(load_data(plan, None, download=False)) == [("synthetic", 0)]  # loaded once, keyed by (dataset, image size)


def test_bad_device_is_one_line_exit_2_and_no_run(tmp_path, runs, capsys):
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    code, err = run_main(["--config", str(write_config(tmp_path / "tiny.yaml")), "--tracking-uri", uri, "--device", "gpu7"], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "--device gpu7" in err
    assert all_runs(uri)[1] == []


def test_experiment_is_tagged_for_model_training_once(tmp_path, runs):
    from study.records import tracking

    uri = f"sqlite:///{runs / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    old = client.create_experiment("made-before-the-tag")
    for name in ("fresh", "made-before-the-tag", "fresh"):
        experiment_id = tracking.setup(uri, name)
        assert client.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert tracking.setup(uri, "made-before-the-tag") == old
    assert len(client.search_experiments(filter_string="name = 'fresh'")) == 1


def test_a_study_is_retrained_on_the_data_root_it_recorded(tmp_path, runs, monkeypatch):
    """study.final --study NAME needs no --data-root: the study's parent run has it (param data_root).

    --data-root wins; $DML_DATA_ROOT is only the default of a study that recorded none, so an exported default never
    sends a study's final to another copy of its data (a study launched with --data-root beside an exported root).
    """
    from study.records import parent, tracking
    from tests.conftest import recorded_params

    monkeypatch.delenv("DML_DATA_ROOT", raising=False)
    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    best = write_config(tmp_path / "best_config.yaml")  # logged as the parent's artifact, as a finished study has it
    recorded = recorded_params(data_root=tmp_path / "study_root")
    client.set_terminated(parent.create_parent_run(client, tracking.setup(uri, "dml-studies"), "s1", str(best), recorded))  # finished
    seen = []

    def load_data(plan, data_root, download):
        seen.append(data_root)
        raise final.UsageError("stop before training")

    monkeypatch.setattr(final_train, "load_data", load_data)
    assert final.main(["--study", "s1"]) == 2
    assert final.main(["--study", "s1", "--data-root", str(tmp_path / "flag")]) == 2
    monkeypatch.setenv("DML_DATA_ROOT", str(tmp_path / "env"))
    assert final.main(["--study", "s1"]) == 2
    assert final.main(["--study", "s1", "--data-root", str(tmp_path / "flag")]) == 2
    unrecorded = recorded_params(data_root=None)  # a study that recorded no data root
    client.set_terminated(parent.create_parent_run(client, tracking.setup(uri, "dml-studies"), "s2", str(best), unrecorded))
    assert final.main(["--study", "s2"]) == 2
    flag, env = str((tmp_path / "flag").resolve()), str((tmp_path / "env").resolve())
    assert seen == [str(tmp_path / "study_root"), flag, str(tmp_path / "study_root"), flag, env]


def test_a_study_is_retrained_to_its_recorded_final_budget(tmp_path, runs):
    """--study trains to the parent run's final_epochs (final_budget_factor x the trials' epochs).

    --epochs wins; a study recorded before final_epochs existed keeps the trials' epochs.
    """
    from study.records import parent, tracking
    from tests.conftest import recorded_params

    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    experiment_id = tracking.setup(uri, "dml-studies")
    best = write_config(tmp_path / "best_config.yaml", epochs=3)
    for name, final_epochs in (("scaled", 6), ("older", None)):  # finished studies
        recorded = recorded_params(epochs=3, final_epochs=final_epochs)
        client.set_terminated(parent.create_parent_run(client, experiment_id, name, str(best), recorded))

    def epochs(*argv):
        plan = make_plan(final.parse_args(list(argv)), uri)
        return plan.configurations[0][1].epochs

    assert epochs("--study", "scaled") == 6
    assert epochs("--study", "scaled", "--epochs", "2") == 2
    assert epochs("--study", "older") == 3


def tied_study(tmp_path: Path) -> tuple[str, mlflow.MlflowClient, str, Path]:
    """A finished study "s1" in the runs folder's store whose race could not tell #4 (softmax) from #7 (ICE, 8-d): its
    parent run with best_config.yaml's config and tied_configs.yaml, as the study writes them, trained to 2 epochs.
    Returns (tracking URI, client, parent run id, the best config's file)."""
    from study.records import parent, tracking
    from tests.conftest import recorded_params

    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    best = write_config(tmp_path / "best_config.yaml")
    tied = [{"trial": 4, "config": {**TINY}}, {"trial": 7, "config": {**TINY, "loss": "ice", "ice_scale": 32.0, "embedding_dim": 8}}]
    (tmp_path / "tied_configs.yaml").write_text(yaml.safe_dump(tied))
    parent_id = parent.create_parent_run(client, tracking.setup(uri, "dml-studies"), "s1", str(best), recorded_params(final_epochs=2))
    client.log_artifact(parent_id, str(tmp_path / "tied_configs.yaml"))
    client.set_terminated(parent_id)
    return uri, client, parent_id, best


@pytest.mark.faults
def test_an_undecided_race_is_trained_as_its_tied_candidates_in_one_model(tmp_path, runs, capsys):
    """A study whose race could not tell #4 from #7 (its tied_configs.yaml, as the study writes it): study.final --study
    trains seed k with the k-th tied candidate, cycling (#4, #7, #4 with seeds 0, 1, 2), each seed run tagged with its
    trial and holding its own config; the three as one model is registered, named by trial and seed, and embeds as the
    three side by side (16 + 8 + 16 wide). --members pick trains the pick alone; --members needs --study."""
    uri, client, parent_id, best = tied_study(tmp_path)
    assert final.main(["--study", "s1"]) == 0
    out = capsys.readouterr().out
    assert "the seeds train Optuna #4 (seed 0), Optuna #7 (seed 1), Optuna #4 (seed 2), as one model" in out
    assert "the study's tied candidates (#4, #7, #4) as one model (their embeddings side by side, 40 wide" in out
    _, found = all_runs(uri)
    seed_runs = sorted((r for r in found if r.data.tags.get("kind") == "final_seed"), key=lambda r: int(r.data.params["seed"]))
    trained = [
        (r.data.tags["optuna_trial"], r.data.params["loss"], r.data.params["embedding_dim"], r.data.params["epochs"]) for r in seed_runs
    ]
    assert trained == [("4", "softmax", "16", "2"), ("7", "ice", "8", "2"), ("4", "softmax", "16", "2")]
    study_parent = client.get_run(parent_id)
    models = {m.source_run_id: m for m in client.search_logged_models([study_parent.info.experiment_id])}
    ensemble_run = assert_ensemble_is_the_seeds_side_by_side(uri, study_parent, seed_runs, models, dims=[16, 8, 16])
    assert client.get_run(ensemble_run).data.tags["trials"] == "4 7 4"
    pictures = {a.path for a in client.list_artifacts(ensemble_run)}  # the registered model's own, which the report shows
    assert {"retrieval_grid_ensemble.png", "tsne_ensemble.png"} <= pictures, pictures
    version = client.get_model_version("s1-embedding", "1")
    assert version.run_id == ensemble_run
    assert "tied candidates Optuna #4 (the pick, seed 0), Optuna #7 (seed 1), Optuna #4 (seed 2) as one model" in version.description
    assert "Config of Optuna #7, seed 1:" in version.description and "ice_scale: 32.0" in version.description
    assert "| metric | this model | #4 alone (the pick) | #7 alone | #4 alone | members' mean |" in version.description
    assert "softmax and ice loss on synthetic" in version.description
    results = json.loads(download(uri, parent_id, "final_results.json", tmp_path / "dl").read_text())
    assert [(r["seed"], r["trial"]) for r in results["per_seed"]] == [(0, 4), (1, 7), (2, 4)]
    assert results["ensemble"]["trials"] == [4, 7, 4] and results["ensemble"]["width"] == 40
    note = client.get_run(parent_id).data.tags["mlflow.note.content"]  # the study's description, as the MLflow UI shows it
    assert "3 seed(s) of 2 epochs (seed k training the k-th of the race's tied candidates: #4, #7, #4) on every training class" in note

    def members(*argv):
        return [(m.trial, m.config.loss) for m in make_plan(final.parse_args(["--study", "s1", *argv]), uri).members]

    assert members() == [(4, "softmax"), (7, "ice")]
    assert members("--members", "pick") == members("--seeds", "1") == []
    with pytest.raises(SystemExit):
        final.parse_args(["--config", str(best), "--members", "pick"])
    assert "--members pick: chooses what a study's final seeds train; give --study" in capsys.readouterr().err


def test_the_study_records_the_final_budget_of_its_space(tmp_path, runs):
    from study.launch import cli as launch

    space = tmp_path / "scaled.yaml"
    lr = {"type": "float", "low": 0.001, "high": 0.01}
    space.write_text(yaml.safe_dump({"fixed": {**TINY, "epochs": 4}, "final_budget_factor": 2.5, "params": {"lr": lr}}))

    def final_epochs(*argv):
        return study_settings(launch.parse_args(list(argv))).record.final_epochs

    assert final_epochs("--space", str(space)) == 10
    assert final_epochs("--space", str(space), "--epochs", "3") == 8  # 7.5, half up
    assert final_epochs("--space", "smoke") == 4  # no factor: the trials' epochs


@pytest.mark.faults
@pytest.mark.parametrize(("signum", "n_seeds"), [(signal.SIGHUP, 1), (signal.SIGTERM, 2)])
def test_a_stopped_final_leaves_no_run_running(tmp_path, signum, n_seeds):
    """A signal to study.final mid-seed: exit 128 + signum, one line naming the signal, its runs KILLED. One seed
    trains in the driver; two, on a machine of several cores, as tasks of a local Ray (study.final.placement). The handlers
    treat SIGINT, SIGTERM and SIGHUP alike (tests/test_interrupts.py sends each to them): one case per place a seed
    trains, with a signal Python would otherwise not turn into an exception.

    Waits on events (the seed's first epoch in MLflow, the process's exit), never on a fixed sleep.
    """
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = write_config(tmp_path / "long.yaml", epochs=500)  # far longer than the wait for its first epoch
    argv = [sys.executable, "-m", "study.final", "--config", str(config), "--tracking-uri", uri, "--seeds", str(n_seeds)]
    driver = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "DML_RUNS_DIR": str(tmp_path / "runs")}, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: logged_epochs(tmp_path / "mlflow.db") > 0, 600, "study.final's first epoch", process=driver)
        driver.send_signal(signum)
        err = driver.communicate(timeout=600)[1]
    finally:
        driver.kill()
    name = signal.Signals(signum).name
    assert driver.returncode == 128 + signum, err
    assert f"study.final stopped by {name}" in err.strip().splitlines()[-1], err
    found = all_runs(uri)[1]
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    seed_runs = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    assert [r.info.status for r in parents + seed_runs] == ["KILLED"] * (1 + n_seeds)
    assert [r.data.tags["failure_reason"] for r in seed_runs] == [f"stopped by {name}"] * n_seeds


def logged_epochs(db: Path) -> int:
    """train_loss points in an MLflow sqlite store, read without MLflow (read-only: no migration races the writer)."""
    if not db.is_file():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as connection:
            return connection.execute("SELECT count(*) FROM metrics WHERE key = 'train_loss'").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is still being created
        return 0


@pytest.mark.parametrize("register", ["../../x", "a/b", "x:y", "..", "two words", "it's"])
def test_a_registered_name_is_refused_before_anything_trains(tmp_path, runs, capsys, monkeypatch, register):
    """Issue 33, finding 11: --register ../../x was refused by MLflow only after every seed had trained (a traceback)."""

    def no_training(*args, **kwargs):
        raise AssertionError("a seed trained before --register was checked")

    monkeypatch.setattr(final_train, "train_seed", no_training)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    code, err = run_main(["--config", str(write_config(tmp_path / "tiny.yaml")), "--tracking-uri", uri, "--register", register], capsys)
    assert code == 2 and err.startswith("error: --register") and len(err.splitlines()) == 1, err
    assert all_runs(uri)[1] == []


def test_the_name_rule_is_at_least_as_strict_as_mlflows_registered_model_names():
    """Every name the rule accepts is one MLflow 3.17 registers; every name MLflow refuses, the rule refuses too."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name

    from study.names import is_name

    candidates = ["s1-embedding", "a.b_c-1", "x" * 100, "../../x", "a/b", "x:y", "..", "a..b", " ", "", "-x", ".x", "x\n"]
    for name in candidates:
        try:
            _validate_model_name(name)
            mlflow_takes = True
        except MlflowException:
            mlflow_takes = False
        assert mlflow_takes or not is_name(name), name
    assert [n for n in candidates if is_name(n)] == ["s1-embedding", "a.b_c-1", "x" * 100]


def test_a_study_still_running_is_refused_naming_how_to_follow_it(tmp_path, runs, capsys, monkeypatch):
    """Issue 33, finding 9: study.final --study on a running study said "no trial completed" while Optuna held a COMPLETE
    trial. A study whose parent run is RUNNING (its driver running, or killed) is refused, saying so and what to run."""
    from study.records import parent, tracking
    from tests.conftest import recorded_params

    def no_training(*args, **kwargs):
        raise AssertionError("a seed trained from a study still running")

    monkeypatch.setattr(final_train, "train_seed", no_training)
    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    best = write_config(tmp_path / "best_config.yaml")  # an artifact of the parent run, as if written early
    run_id = parent.create_parent_run(client, tracking.setup(uri, "dml-studies"), "busy", str(best), recorded_params())
    assert client.get_run(run_id).info.status == "RUNNING"
    code, err = run_main(["--study", "busy", "--seeds", "1"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "study busy is still running" in err and f"parent run {run_id} is RUNNING" in err
    assert "mlflow ui" in err and "study.launch --study-name busy --resume" in err  # how to follow it; a killed driver's study
    assert [r.info.run_id for r in all_runs(uri)[1]] == [run_id]


def seed_result(seed: int, recall: float, registered: str | None = None) -> SeedResult:
    test = {key: 0.5 for key in ("test_nmi", "test_recall_at_2", "test_recall_at_4", "test_recall_at_8", "test_map_at_r")}
    test["test_recall_at_1"] = recall
    return SeedResult(seed, f"run{seed}", test, 60.0 + seed, f"models:/m-{seed}", registered)


def test_final_results_are_typed_and_printed_from_their_fields(capsys):
    """Issue 30: run_final's result is a FinalResult of ConfigurationResults of SeedResults (frozen dataclasses), which
    the printers read; results.json keeps the same fields."""
    config = TrainConfig.from_dict(TINY)
    seeds = (seed_result(0, 0.6, registered="models:/s1-embedding/1"), seed_result(1, 0.8))
    only = ConfigurationResult("s1", config, seeds, summarize([s.test for s in seeds]) | {"time_per_seed_s_mean": 60.5})
    result = FinalResult("s1", "sqlite:///x.db", "parent1", (only,))
    with pytest.raises(AttributeError):
        result.name = "other"  # frozen
    expected = {"seed": 0, "run_id": "run0", "test": seeds[0].test, "time_s": 60.0, "model_uri": "models:/m-0"}
    assert only.record()["per_seed"][0] == {**expected, "registered_uri": "models:/s1-embedding/1", "trial": None}  # no race's tie
    assert only.record()["summary"]["test_recall_at_1_mean"] == pytest.approx(0.7)
    print_summary(result)
    out = capsys.readouterr().out
    assert "s1: test metrics over 2 seed(s) (mean +- std)" in out
    assert "  test_recall_at_1         0.7000 +- 0.1414" in out  # sample std of 0.6 and 0.8: 0.2 / sqrt(2)
    assert "  time per seed            60 s" in out and "parent run: parent1" in out  # 60.5 rounds half to even
    assert "  model: models:/m-1  (run run1)" in out and "registered as: models:/s1-embedding/1: the first seed's model, seed 0" in out
    assert "-m models:/s1-embedding/1 " in out  # the registered version is what the serve command serves

    ensemble = EnsembleResult("run9", {"test_recall_at_1": 0.75}, "models:/m-9")
    joint = dataclasses.replace(only, summary=only.summary | {"ensemble_test_recall_at_1": 0.75}, ensemble=ensemble)
    assert joint.record()["ensemble"] == {
        "run_id": "run9",
        "test": {"test_recall_at_1": 0.75},
        "model_uri": "models:/m-9",
        "registered_uri": None,
        "trials": (),  # seeds of one configuration; a study's tie names its candidates here
        "width": 0,
    }
    print_summary(FinalResult("s1", "sqlite:///x.db", "parent1", (dataclasses.replace(joint, seeds=(seed_result(0, 0.6), seeds[1])),)))
    out = capsys.readouterr().out
    assert "the 2 seeds as one model (their embeddings side by side, 2 x 16 wide" in out
    assert "  test_recall_at_1         0.7500  (seeds' mean 0.7000)" in out and "  model: models:/m-9  (run run9)" in out
    assert "-m models:/m-9 " in out  # without a registered version the serve command serves the ensemble
    registered = dataclasses.replace(joint, ensemble=dataclasses.replace(ensemble, registered_uri="models:/s1-embedding/2"))
    print_summary(FinalResult("s1", "sqlite:///x.db", "parent1", (registered,)))
    out = capsys.readouterr().out
    assert "  registered as: models:/s1-embedding/2: the 2 seeds as one model" in out and "-m models:/s1-embedding/2 " in out

    other = ConfigurationResult("b", config, (seed_result(0, 0.4), seed_result(1, 0.5)), only.summary)
    print_summary(FinalResult("g", "sqlite:///x.db", "parent2", (only, other)))
    grid = capsys.readouterr().out
    assert "g: test metrics over 2 seed(s), mean +- std" in grid
    assert [line.split()[0] for line in grid.splitlines() if line.startswith("  s1 ") or line.startswith("  b ")] == ["s1", "b"]


# -- where the seeds train (study.final.placement) and the closing lines ----------------------------------------------------------


def test_the_local_rule_trains_the_seeds_side_by_side_on_several_cores_with_a_share_of_the_threads():
    """README (study.final section) has the measurement behind the rule; a GPU, one seed or one core: in the driver."""
    two_cores = seeds.local_placement(2, 3, "cpu")
    assert two_cores.parallel and two_cores.address is None and two_cores.threads == 1 and two_cores.local_cpus == 3.0
    assert seeds.local_placement(16, 3, "cpu").threads == 5
    assert seeds.local_placement(2, 2, "cpu").threads == 1
    for cores, n, device in ((1, 3, "cpu"), (2, 1, "cpu"), (16, 3, "cuda")):
        assert seeds.local_placement(cores, n, device) == seeds.Placement(parallel=False), (cores, n, device)


def test_a_clusters_seed_task_holds_the_studys_trial_resources_unless_the_flags_say_otherwise(tmp_path):
    config = str(write_config(tmp_path / "tiny.yaml"))
    plan = make_plan(final.parse_args(["--config", config]), "sqlite:///unused.db")
    study_plan = dataclasses.replace(plan, trial_resources=(2.0, 0.5))  # a study recorded with --cpus-per-trial 2 --gpus-per-trial 0.5

    def placed(*flags: str) -> tuple:
        p = placement_of(final.parse_args(["--config", config, *flags]), study_plan, torch.device("cpu"))
        return p.parallel, p.address, p.cpus, p.gpus, p.threads

    assert placed("--address", "10.0.0.5:6379") == (True, "10.0.0.5:6379", 2.0, 0.5, 2)
    assert placed("--address", "auto", "--cpus-per-trial", "4", "--gpus-per-trial", "1") == (True, "auto", 4.0, 1.0, 4)
    here = seeds.local_placement(len(os.sched_getaffinity(0)), 3, "cpu")
    assert placed() == (here.parallel, None, here.cpus, here.gpus, here.threads)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--cpus-per-trial", "2"], "--cpus-per-trial sizes a seed's task on a Ray cluster; give --address"),
        (["--gpus-per-trial", "1"], "--gpus-per-trial sizes a seed's task on a Ray cluster; give --address"),
        (["--address", "auto", "--cpus-per-trial", "0"], "--cpus-per-trial 0.0: expected a finite number > 0"),
        (["--address", "auto", "--gpus-per-trial", "nan"], "--gpus-per-trial nan: expected a finite number >= 0"),
        (["--address", "auto", "--device", "cuda"], "--device: with --address a seed trains on CUDA when it holds a GPU"),
    ],
)
def test_placement_flags_are_checked_before_anything_starts(capsys, argv, needle):
    with pytest.raises(SystemExit) as exited:
        final.parse_args(argv)
    assert exited.value.code == 2 and needle in capsys.readouterr().err


def test_the_closing_lines_open_the_runs_table_and_name_the_report_of_a_study(capsys):
    """Issue 32, findings 1 and 6: the UI line ends with the address of the experiment's runs table (MLflow 3.17 opens
    its GenAI views otherwise); a study's final training (and a grid's) names study.report, a config file's does not."""
    config = TrainConfig.from_dict(TINY)
    seeds_done = (seed_result(0, 0.6, registered="models:/s1-embedding/1"),)
    only = ConfigurationResult("s1", config, seeds_done, summarize([s.test for s in seeds_done]) | {"time_per_seed_s_mean": 60.0})
    print_summary(FinalResult("s1", "sqlite:///x.db", "p", (only,), experiment_id="7", report="s1", study="s1"))
    out = capsys.readouterr().out
    assert "open the MLflow UI at the study's runs, the pick first" in out  # the view the study printed, not the folded table
    assert "then open http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=s1&workflowType=machine_learning" in out
    assert out.count(" -m study.report --study s1") == 1 and "--tracking-uri" not in out.split("study.report")[1].splitlines()[0]
    print_summary(FinalResult("s1", "http://10.0.0.1:5000", "p", (only,), experiment_id="7", report="s1"))
    out = capsys.readouterr().out
    assert "open http://10.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning in a browser" in out  # a grid's
    assert " -m study.report --study s1 --tracking-uri http://10.0.0.1:5000" in out
    print_summary(FinalResult("tiny", "sqlite:///x.db", "p", (only,), experiment_id="7"))
    assert "study.report" not in capsys.readouterr().out


@pytest.mark.faults
def test_runs_a_killed_final_left_running_end_killed_at_the_next_final(tmp_path):
    """A study.final SIGKILLed mid-seed runs no handler: its parent and seed runs stay RUNNING. The next study.final on
    this host (with the same runs folder) finds their owner lock unheld, marks them KILLED with the killed one's holder
    line as the reason, says so, and trains its own runs to FINISHED."""
    uri, env = f"sqlite:///{tmp_path / 'mlflow.db'}", {**os.environ, "DML_RUNS_DIR": str(tmp_path / "runs")}
    long = write_config(tmp_path / "long.yaml", epochs=500)
    argv = [sys.executable, "-m", "study.final", "--tracking-uri", uri, "--seeds", "1", "--config"]
    killed = subprocess.Popen([*argv, str(long)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: logged_epochs(tmp_path / "mlflow.db") > 0, 600, "study.final's first epoch", process=killed)
    finally:
        killed.kill()
        killed.wait()
    before = all_runs(uri)[1]
    assert sorted(r.info.status for r in before) == ["RUNNING", "RUNNING"]  # the parent and its seed
    short = write_config(tmp_path / "short.yaml", epochs=1)
    out = subprocess.run([*argv, str(short)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    names = ", ".join(sorted(r.info.run_name for r in before))
    assert f"marked KILLED 2 run(s) an earlier study.final left RUNNING when it was killed: {names}" in out.stdout
    runs = {r.info.run_id: r for r in all_runs(uri)[1]}
    for old in before:
        run = runs.pop(old.info.run_id)
        assert run.info.status == "KILLED"
        assert run.data.tags["failure_reason"].startswith(f"orphaned: the study.final that trained it (pid {killed.pid} on ")
    assert sorted(r.info.status for r in runs.values()) == ["FINISHED", "FINISHED"]  # the new parent and seed
    assert not list((tmp_path / "runs" / "locks").glob("final-*.lock"))  # the killed one's lock is gone with its runs


def test_a_study_whose_end_could_not_write_mlflow_is_refused_naming_study_sync(tmp_path, runs, capsys, monkeypatch):
    """A study whose end could not write MLflow (unreachable, or its disk full) leaves its parent RUNNING and its records
    in the spool: study.final --study says so and gives the study.sync command, not a --resume of a driver it calls
    killed."""
    from study.records import parent, tracking
    from study.records.trials import spool_path
    from tests.conftest import recorded_params

    monkeypatch.setattr(final_train, "train_seed", lambda *a, **k: pytest.fail("a seed trained from a study still running"))
    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    best = write_config(tmp_path / "best_config.yaml")
    run_id = parent.create_parent_run(client, tracking.setup(uri, "dml-studies"), "unsynced", str(best), recorded_params())
    spool = Path(spool_path("unsynced"))
    spool.parent.mkdir(parents=True, exist_ok=True)
    spool.write_text('{"op": "end"}\n')
    code, err = run_main(["--study", "unsynced", "--seeds", "1"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"study unsynced is still running (its MLflow parent run {run_id} is RUNNING)" in err
    assert f"its records wait in {spool}, not yet written to MLflow" in err
    assert err.rstrip().split("retrain its pick: ")[1].split(";")[0].endswith("study.sync --study unsynced --experiment dml-studies")
    assert "--resume" not in err


def test_a_signal_while_the_parent_run_is_created_leaves_it_killed_not_running(tmp_path, runs, capsys, monkeypatch):
    """A SIGTERM between the parent run's creation and its params (the driver's first MLflow writes): the writes end,
    then study.final stops as a signal stops it mid-seed: exit 143, the parent KILLED with the reason, no seed run.
    Before, the signal cut open_parent outside the block that marks runs stopped, and the parent stayed RUNNING."""

    def no_training(*args, **kwargs):
        raise AssertionError("a seed trained after the signal")

    created = mlflow.MlflowClient.create_run

    def create_then_signal(self, *args, **kwargs):
        run = created(self, *args, **kwargs)
        signal.raise_signal(signal.SIGTERM)
        return run

    monkeypatch.setattr(final_train, "train_seed", no_training)
    monkeypatch.setattr(mlflow.MlflowClient, "create_run", create_then_signal)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    code, err = run_main(["--config", str(write_config(tmp_path / "tiny.yaml")), "--tracking-uri", uri], capsys)
    assert code == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err
    (parent,) = all_runs(uri)[1]
    assert parent.info.status == "KILLED" and parent.data.tags["failure_reason"] == "stopped by SIGTERM"
    assert parent.data.params["seeds"] == "0,1,2" and "lr" in parent.data.params  # written after the signal arrived


def test_a_signal_during_the_last_write_says_the_runs_finished(tmp_path, runs, capsys, monkeypatch):
    """A SIGTERM while the finished parent run is marked FINISHED (the driver's last write) waits for that write, then
    stops study.final with 143. Its message says what is true then: every run ended FINISHED. Before, it said the
    runs were "marked KILLED", as for a signal mid-training."""
    created, terminated = mlflow.MlflowClient.create_run, mlflow.MlflowClient.set_terminated
    parent: list[str] = []

    def create(self, *args, **kwargs):
        run = created(self, *args, **kwargs)
        parent.append(parent[0] if parent else run.info.run_id)  # the parent run is the first one created
        return run

    def terminate_then_signal(self, run_id, *args, **kwargs):
        terminated(self, run_id, *args, **kwargs)
        if run_id == parent[0]:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(mlflow.MlflowClient, "create_run", create)
    monkeypatch.setattr(mlflow.MlflowClient, "set_terminated", terminate_then_signal)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    code, err = run_main(["--config", str(write_config(tmp_path / "tiny.yaml")), "--tracking-uri", uri, "--seeds", "1"], capsys)
    assert code == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and "marked KILLED" not in err and "FINISHED" in err, err
    client, found = all_runs(uri)
    assert len(found) == 2 and {r.info.status for r in found} == {"FINISHED"}, [(r.info.run_name, r.info.status) for r in found]
