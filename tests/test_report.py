"""study.report: hand-computed references, then a tiny grid of final runs (study.final --space) end to end.

References: ASHA rungs are grace * factor^i below max_t (Li et al., ASHA; Ray's
AsyncHyperBandScheduler); Spearman's rho of rankings without ties is
1 - 6 sum(d^2) / (n (n^2 - 1)); the table cells are mean +- sample standard
deviation (ddof 1) in percent, worked out by hand below. The end-to-end test
trains 2 configurations x 2 seeds x 1 epoch on generated glyphs (about a
minute on two CPUs) and checks the report against the seed runs' metrics read
from MLflow directly.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import mlflow
import optuna
import pytest
import yaml

from study.final import cli as final
from study.records.curves import asha_rungs
from study.report import cli as report
from study.report.document import markdown
from study.report.finals import ensemble_line, final_seed_runs
from study.report.sections import find_parent, importance_section, paper_table, rung_rank_correlation, top_trials
from study.search.journal import open_storage
from tests.conftest import recorded_params


def all_runs(uri):
    client = mlflow.MlflowClient(uri)
    experiments = client.search_experiments()
    return client, client.search_runs([e.experiment_id for e in experiments]) if experiments else []


# -- asha_rungs --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "grace, factor, max_epochs, expected",
    [
        (1, 3, 6, [1, 3]),  # 9 >= 6
        (2, 3, 12, [2, 6]),  # 18 >= 12
        (6, 3, 6, []),  # the grace period is already the last epoch
        (1, 3, 9, [1, 3]),  # a rung at max_t is the end, not a rung
        (1, 2, 4, [1, 2]),  # tests/test_launch.py's study
        (1, 2, 20, [1, 2, 4, 8, 16]),
        (2, 1.5, 8, [2, 3, 4, 7]),  # 2, 3, 4.5 -> 4 (round half to even), 6.75 -> 7, 10.1 >= 8
    ],
)
def test_asha_rungs_hand_values(grace, factor, max_epochs, expected):
    assert asha_rungs(grace, factor, max_epochs) == expected


# -- rung_rank_correlation ---------------------------------------------------------------------------------------------


def spearman_by_hand(x: list[float], y: list[float]) -> float:
    """1 - 6 sum(d^2) / (n (n^2 - 1)), with ranks found by counting (no ties)."""

    def ranks(values):
        return [1 + sum(other < v for other in values) for v in values]

    n = len(x)
    d2 = sum((a - b) ** 2 for a, b in zip(ranks(x), ranks(y)))
    return 1 - 6 * d2 / (n * (n * n - 1))


CURVES = [  # epoch 1, 2, 3
    [0.1, 0.5, 0.9],  # A
    [0.2, 0.4, 0.7],  # B
    [0.3, 0.6, 0.8],  # C
    [0.4, 0.3, 0.6],  # D
    [0.05, 0.95],  # E: stopped at epoch 2, does not count
    [0.99],  # F: stopped at epoch 1, does not count
]


def test_rung_rank_correlation_hand_computed():
    # epoch 1: ranks A..D 1 2 3 4; epoch 3: 0.9 0.7 0.8 0.6 -> 4 2 3 1; d = -3 0 0 3, sum d^2 = 18
    # rho = 1 - 6 * 18 / (4 * 15) = -0.8
    # epoch 2: 0.5 0.4 0.6 0.3 -> 3 2 4 1; d = -1 0 1 0, sum d^2 = 2; rho = 1 - 12 / 60 = 0.8
    out = rung_rank_correlation(CURVES, [1, 2, 3, 9], final=3)
    assert sorted(out) == [1, 2]  # rungs at or past the final epoch are dropped
    assert out[1]["spearman"] == pytest.approx(-0.8)
    assert out[2]["spearman"] == pytest.approx(0.8)
    assert out[1]["n"] == out[2]["n"] == 4  # E and F (shorter than 3 epochs) excluded
    full = CURVES[:4]
    assert out[1]["spearman"] == pytest.approx(spearman_by_hand([c[0] for c in full], [c[2] for c in full]))
    assert out[2]["spearman"] == pytest.approx(spearman_by_hand([c[1] for c in full], [c[2] for c in full]))


def test_rung_rank_correlation_reversed_and_identical_rankings():
    # five trials whose order at epoch 1 is the exact reverse of their order at epoch 2: rho = -1
    reversed_curves = [[0.1 * i, 1.0 - 0.1 * i] for i in range(1, 6)]
    assert rung_rank_correlation(reversed_curves, [1], final=2)[1] == {"spearman": pytest.approx(-1.0), "n": 5}
    # the same order at both epochs, although the values differ: rho = 1
    same = [[0.1 * i, 0.5 + 0.01 * i] for i in range(1, 6)]
    assert rung_rank_correlation(same, [1], final=2)[1]["spearman"] == pytest.approx(1.0)


def test_rung_rank_correlation_needs_three_trials():
    two = [[0.1, 0.2, 0.3], [0.3, 0.2, 0.1], [0.5]]  # only two reach epoch 3
    out = rung_rank_correlation(two, [1, 2], final=3)
    assert sorted(out) == [1, 2]
    assert all(math.isnan(row["spearman"]) and row["n"] == 2 for row in out.values())
    assert all(math.isnan(row["spearman"]) for row in rung_rank_correlation([], [1], final=3).values())


# -- paper_table -------------------------------------------------------------------------------------------------------

METRIC_KEYS = ("test_nmi", "test_recall_at_1", "test_recall_at_2", "test_recall_at_4", "test_recall_at_8", "test_map_at_r")


def seeds(**per_metric: list[float]) -> list[dict[str, float]]:
    """Three seeds' metrics from {short key: [seed0, seed1, seed2]}."""
    return [{f"test_{k}": v[i] for k, v in per_metric.items()} for i in range(3)]


def table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines()[2:]:
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_paper_table_layout_mean_std_and_bold():
    a = seeds(
        nmi=[0.80, 0.80, 0.80],  # 80.0 +- 0.0
        recall_at_1=[0.50, 0.60, 0.70],  # mean 60.0; deviations -10 0 10 -> var 200 / 2 = 100 -> std 10.0
        recall_at_2=[0.70, 0.70, 0.76],  # mean 72.0; deviations -2 -2 4 -> var 24 / 2 = 12 -> std 3.464 -> 3.5
        recall_at_4=[0.90, 0.90, 0.90],
        recall_at_8=[0.95, 0.96, 0.97],  # 96.0 +- 1.0
        map_at_r=[0.10, 0.20, 0.30],  # 20.0 +- 10.0
    )
    b = seeds(
        nmi=[0.90, 0.92, 0.94],  # 92.0 +- 2.0
        recall_at_1=[0.40, 0.45, 0.50],  # 45.0 +- 5.0
        recall_at_2=[0.50, 0.50, 0.50],  # 50.0 +- 0.0
        recall_at_4=[0.80, 0.85, 0.90],  # 85.0 +- 5.0
        recall_at_8=[0.99, 0.99, 0.99],  # 99.0 +- 0.0
        map_at_r=[0.30, 0.30, 0.30],  # 30.0 +- 0.0
    )
    text = markdown(paper_table({"SM": a, "HBN": b}))
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")][1:] == ["SM", "HBN"]
    rows = table_rows(text)
    assert list(rows) == ["NMI", "R@1", "R@2", "R@4", "R@8", "MAP@R"]
    assert rows["NMI"] == ["80.0 ± 0.0", "**92.0 ± 2.0**"]
    assert rows["R@1"] == ["**60.0 ± 10.0**", "45.0 ± 5.0"]
    assert rows["R@2"] == ["**72.0 ± 3.5**", "50.0 ± 0.0"]
    assert rows["R@4"] == ["**90.0 ± 0.0**", "85.0 ± 5.0"]
    assert rows["R@8"] == ["96.0 ± 1.0", "**99.0 ± 0.0**"]
    assert rows["MAP@R"] == ["20.0 ± 10.0", "**30.0 ± 0.0**"]
    assert "3 seed(s)" in text


def test_paper_table_single_column_and_missing_metric():
    only = [{"test_recall_at_1": 0.5}, {"test_recall_at_1": 0.7}]  # 60.0; deviations -10 10 -> var 200 -> std 14.1
    rows = table_rows(markdown(paper_table({"best": only})))
    assert rows["R@1"] == ["60.0 ± 14.1"]  # one column: nothing to bold
    assert rows["NMI"] == rows["MAP@R"] == ["-"]
    one = table_rows(markdown(paper_table({"a": [{"test_recall_at_1": 0.5}], "b": [{"test_recall_at_1": 0.7}, {"test_recall_at_1": 0.5}]})))
    assert one["R@1"] == ["50.0 (n = 1)", "**60.0 ± 14.1**"]  # one seed: no spread to show


# -- study.report: errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nope", "it's", "a' or tags.kind = 'study"])
def test_report_unknown_or_malformed_study_exits_2(tmp_path, runs, capsys, name):
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    code = report.main(["--study", name, "--tracking-uri", uri, "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error:")
    assert not (tmp_path / "out" / "report.md").exists()


# -- study.report of a study, from records written by hand ---------------------------------------------------------------

STUDY_CURVES = {  # trial -> (val_recall_at_1 per epoch, final state, lr)
    "trial_0": ([0.1, 0.5, 0.9], "COMPLETE", 0.01),
    "trial_1": ([0.2, 0.4, 0.7], "COMPLETE", 0.02),
    "trial_2": ([0.3, 0.6, 0.8], "COMPLETE", 0.03),
    "trial_3": ([0.4, 0.3, 0.6], "COMPLETE", 0.04),
    "trial_4": ([0.05], "PRUNED", 0.05),
}


def write_study_records(tmp_path, storage: str, parent_params: dict[str, str] | None = None, notes: dict[str, str] | None = None):
    """A study's parent run and trial runs as study.launch leaves them, and its Optuna study; returns the tracking URI.

    The parent run's params are a study's record (``recorded_params``) changed by ``parent_params`` (None: a param
    recorded before it existed); ``notes``: a ``note`` param of the trials it names.
    """
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("dml-studies", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(experiment, run_name="hand", tags={"study_name": "hand", "kind": "study"}).info.run_id
    asha = {"scheduler": None, "budgets": None}  # recorded before the budget scheduler: stock ASHA
    params = {"epochs": 3, "grace_period": 1, "reduction_factor": 3, "num_samples": 5, "optuna_storage": storage, **asha}
    params = recorded_params(**{**params, **(parent_params or {})})
    client.log_batch(parent, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
    client.log_metric(parent, "n_complete", 4)
    client.set_terminated(parent, "FINISHED")
    study = optuna.create_study(study_name="hand", direction="maximize", storage=open_storage(storage))
    for name, (curve, state, lr) in STUDY_CURVES.items():
        tags = {"mlflow.parentRunId": parent, "kind": "trial", "trial_id": name, "optuna_state": state}
        run = client.create_run(experiment, run_name=name, tags=tags).info.run_id
        client.log_param(run, "lr", lr)
        if name in (notes or {}):
            client.log_param(run, "note", notes[name])
        for epoch, value in enumerate(curve, start=1):
            client.log_metric(run, "val_recall_at_1", value, step=epoch)
        client.set_terminated(run, "FINISHED")
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(0.001, 0.1)})
        study.tell(trial, curve[-1] if state == "COMPLETE" else None, state=optuna.trial.TrialState[state])
    return uri


@pytest.mark.parametrize("stored", [True, False])
def test_report_of_a_study_from_hand_written_records(tmp_path, runs, stored):
    uri = write_study_records(tmp_path, f"journal:{tmp_path / 'optuna.log'}")
    if not stored:  # the Optuna storage has moved since the study ended
        (tmp_path / "optuna.log").unlink()
    out = tmp_path / "report"
    assert report.main(["--study", "hand", "--tracking-uri", uri, "--out", str(out), "--no-log", "--top", "3"]) == 0
    text = (out / "report.md").read_text()
    sections = {part.split("\n")[0]: part for part in text.split("\n## ")[1:]}
    top = [line.split("|")[1:4] for line in sections["Top trials by val_recall_at_1"].splitlines() if line.startswith("| trial_")]
    assert [[c.strip() for c in row] for row in top] == [["trial_0", "0.9000", "3"], ["trial_2", "0.8000", "3"], ["trial_1", "0.7000", "3"]]
    # rung 1 of grace 1, factor 3, 3 epochs: rho -0.8 by hand (see test_rung_rank_correlation_hand_computed); trial_4 excluded
    rungs = [line for line in sections["Is early stopping trustworthy here?"].splitlines() if line.startswith("| 1 ")]
    assert rungs == ["| 1 | -0.800 | 4 |"]
    importances = sections["Parameter importances"]
    if stored:
        assert "| lr | 1.000 |" in importances and (out / "param_importances.png").is_file()
    else:  # the storage is gone and the study ended with no plot: said in one line
        assert "(parameter importances unavailable: " in importances
    assert (out / "learning_curves.png").is_file() and "![learning curves](learning_curves.png)" in text
    assert "The x axis counts the epochs" not in text  # stock ASHA: a trial's steps are the epochs of its one schedule
    assert "(none yet: `python -m study.final --study hand`)" in text
    assert not (out / "tmp").exists()


def test_the_report_reads_a_study_as_its_record_does(tmp_path, runs):
    """Issue 30: the report read the parent run's params itself, with its own values for a param a study recorded before
    it existed (grace period 1, reduction factor 3), and named rungs such a study never had; StudyRecord's values are
    the ones study.launch ran with (a quarter of the epochs, factor 4)."""
    older = {"epochs": 16, "grace_period": None, "reduction_factor": None}
    uri = write_study_records(tmp_path, f"journal:{tmp_path / 'optuna.log'}", parent_params=older)
    out = tmp_path / "report"
    assert report.main(["--study", "hand", "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    assert "stock ASHA at epochs 4 of the full schedule" in (out / "report.md").read_text()


# -- end to end: study.final --space, then study.report ----------------------------------------------------------------

TINY_SPACE = {
    "description": "two tiny variants for the report test",
    "fixed": {
        "dataset": "synthetic",
        "backbone": "small_cnn",
        "image_size": 32,
        "loss": "softmax",
        "optimizer": "adam",
        "epochs": 3,
        "embedding_dim": 16,
        "classes_per_batch": 8,
        "samples_per_class": 2,
        "alpha": 16.0,
    },
    "variants": {
        "plain": {"normalization": "l2", "weight_norm": True, "heating": "none"},
        "heated": {"normalization": "bn", "weight_norm": True, "heating": "two_stage", "heating_target": 4.0},
    },
}


@pytest.mark.faults
@pytest.mark.slow
def test_final_space_then_report(tmp_path, runs, capsys):
    path = tmp_path / "tiny_grid.yaml"
    path.write_text(yaml.safe_dump(TINY_SPACE, sort_keys=False))
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    assert final.main(["--space", str(path), "--seeds", "2", "--epochs", "1", "--tracking-uri", uri, "--experiment", "grid"]) == 0
    capsys.readouterr()

    client, found = all_runs(uri)
    parents = [r for r in found if r.data.tags.get("kind") == "final_grid"]
    children = [r for r in found if r.data.tags.get("kind") == "final_seed"]
    ensembles = {r.data.tags["configuration"]: r for r in found if r.data.tags.get("kind") == "final_ensemble"}
    assert len(parents) == 1 and len(found) == 7  # the parent, 2 seeds and their ensemble per configuration
    assert {c: r.info.run_name for c, r in ensembles.items()} == {"heated": "heated-ensemble", "plain": "plain-ensemble"}
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["study_name"] == "tiny_grid" and parent.data.tags["configurations"] == "2"
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    by_conf: dict[str, list] = {}
    for r in children:
        by_conf.setdefault(r.data.tags["configuration"], []).append(r)
        assert r.data.params["epochs"] == "1" and r.data.params["dataset"] == "synthetic"
    assert sorted(by_conf) == ["heated", "plain"]
    assert all(sorted(int(r.data.tags["seed"]) for r in runs_) == [0, 1] for runs_ in by_conf.values())
    assert {r.data.params["heating"] for r in by_conf["heated"]} == {"two_stage"}
    assert {r.data.params["normalization"] for r in by_conf["plain"]} == {"l2"}

    assert {"configurations.yaml", "results.json"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    results = json.loads(parent_file(uri, parent, "results.json", tmp_path / "dl").read_text())
    assert sorted(results) == ["heated", "plain"]
    for conf, runs_ in by_conf.items():
        assert len(results[conf]["per_seed"]) == 2
        r1 = sorted(r.data.metrics["test_recall_at_1"] for r in runs_)
        assert sorted(s["test"]["test_recall_at_1"] for s in results[conf]["per_seed"]) == pytest.approx(r1)
        assert results[conf]["summary"]["test_recall_at_1_mean"] == pytest.approx(sum(r1) / 2)
        joint = ensembles[conf].data.metrics["test_recall_at_1"]
        assert results[conf]["ensemble"]["test"]["test_recall_at_1"] == results[conf]["summary"]["ensemble_test_recall_at_1"] == joint
    configurations = yaml.safe_load(parent_file(uri, parent, "configurations.yaml", tmp_path / "dl").read_text())
    assert configurations["heated"]["heating"] == "two_stage" and configurations["plain"]["normalization"] == "l2"
    assert_grid_report(client, uri, parent, by_conf, tmp_path / "report")


def parent_file(uri: str, parent, name: str, dst: Path) -> Path:
    return Path(mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path=name, dst_path=str(dst), tracking_uri=uri))


def assert_grid_report(client, uri: str, parent, by_conf: dict[str, list], out: Path) -> None:
    """study.report of the grid: the papers' table against the seed runs' metrics in MLflow, every plot written and logged."""
    assert report.main(["--study", "tiny_grid", "--tracking-uri", uri, "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| metric"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    assert sorted(columns) == ["heated", "plain"]
    rows = table_rows(text[text.index(header) :].split("\n\n")[0])
    assert {"NMI", "R@1", "MAP@R"} <= set(rows)
    for conf in columns:  # the R@1 cell against the seed runs' test metric, read from MLflow
        values = [r.data.metrics["test_recall_at_1"] for r in by_conf[conf]]
        mean = 100 * sum(values) / len(values)
        assert rows["R@1"][columns.index(conf)].strip("*").split(" ± ")[0] == f"{mean:.1f}"
        std = 100 * abs(values[0] - values[1]) / math.sqrt(2)  # sample std of two values
        assert rows["R@1"][columns.index(conf)].strip("*").split(" ± ")[1] == f"{std:.1f}"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images and all(name.endswith(".png") and (out / name).is_file() for name in images)
    assert "train_loss.png" in images
    assert sum(name.startswith("similarity_") for name in images) == 2  # one histogram per configuration
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert "report/report.md" in logged and {f"report/{name}" for name in images} <= logged
    # report.html: the same report in one file, with every picture embedded (study.final logged a retrieval grid and a t-SNE map)
    assert "report/report.html" in logged
    html = (out / "report.html").read_text()
    assert sum(name.startswith(("retrieval_grid_", "tsne_")) for name in images) == 4  # two per configuration
    assert html.count('src="data:image/png;base64,') == len(images) and 'src="' + images[0] not in html


def test_finished_schedules_read_each_budget_at_its_end():
    """A ladder trial (budgets 2, 4; budget 4 resumed after 1 epoch) logs steps 1..4, the epochs of its schedule (its
    budget-4 epoch 2, retrained, under other names); its rung values sit at steps 2 and 4."""
    from types import SimpleNamespace

    from study.report.sections import finished_schedules

    logged = {"budget": [2, 2, 4, 4]}

    class Client:
        def get_metric_history(self, run_id, key):
            return [SimpleNamespace(step=i + 1, value=v, timestamp=i) for i, v in enumerate(logged[key])]

    run = SimpleNamespace(info=SimpleNamespace(run_id="r", run_name="trial-a"), data=SimpleNamespace(tags={}))
    histories = {"trial-a": {1: 0.1, 2: 0.5, 3: 0.4, 4: 0.9}}
    assert finished_schedules(Client(), [run], histories) == {"trial-a": {2: 0.5, 4: 0.9}}


# -- paging: MLflow answers a search in pages (issue 27) ------------------------------------------------------------------


class PagingMlflow:
    """An MLflow client whose search_runs answers as MLflow does: at most ``max_results`` runs (refused above 50,000)
    and a page token for the rest; it counts its calls. Filters are tracking.run_filter's ``key = 'value' and ...``."""

    def __init__(self, runs: list) -> None:
        self.runs, self.calls = runs, 0

    def search_runs(self, experiment_ids, filter_string="", max_results=1000, order_by=None, page_token=None):
        from mlflow.store.entities.paged_list import PagedList

        assert max_results <= 50_000
        self.calls += 1
        wanted = dict(re.findall(r"tags\.([\w.]+) = '([^']*)'", filter_string))
        found = [r for r in self.runs if all(r.data.tags.get(k) == v for k, v in wanted.items())]
        found.sort(key=lambda r: r.info.start_time, reverse=bool(order_by and order_by[0].endswith("DESC")))
        start = int(page_token or 0)
        rest = start + max_results < len(found)
        return PagedList(found[start : start + max_results], str(start + max_results) if rest else None)

    def search_experiments(self, max_results=1000, page_token=None):
        """1,500 experiments, in pages; only "0" holds runs."""
        from mlflow.store.entities.paged_list import PagedList

        self.calls += 1
        start = int(page_token or 0)
        ids = [str(i) for i in range(start, min(start + max_results, 1500))]
        return PagedList([SimpleNamespace(experiment_id=i) for i in ids], str(start + max_results) if start + max_results < 1500 else None)


def fake_run(run_id: str, start_time: int, **tags):
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, experiment_id="0", start_time=start_time), data=SimpleNamespace(tags=tags))


def test_every_search_reads_every_page():
    """12,000 trials, 12,000 seed runs: each search returns all of them, in pages (before: 10,000 trials, 5,000 seeds, and a
    study's parent, its oldest run, fell off the 5,000 newest runs of its name)."""
    from study.records import tracking

    parent = fake_run("parent", 0, study_name="big", kind="study")
    trials = [fake_run(f"t{i}", 1 + i, study_name="big", kind="trial", **{"mlflow.parentRunId": "parent"}) for i in range(12_000)]
    seeds = [fake_run(f"s{i}", 20_000 + i, kind="final_seed", **{"mlflow.parentRunId": "parent"}) for i in range(12_000)]
    client = PagingMlflow([parent, *trials, *seeds])
    assert sorted(r.info.run_id for r in tracking.child_runs(client, "0", "parent")) == sorted(r.info.run_id for r in trials)
    assert 12 <= client.calls <= 13  # pages of 1,000
    assert [r.info.run_id for r in final_seed_runs(client, parent)] == [r.info.run_id for r in seeds]
    assert find_parent(client, "big", None) is parent  # in any of 1,500 experiments


# -- parameters a trial did not train with (issue 32) ------------------------------------------------------------------


def trial_run(name: str, params: dict, **tags):
    return SimpleNamespace(info=SimpleNamespace(run_id=name, run_name=name), data=SimpleNamespace(params=params, tags=tags, metrics={}))


def test_the_top_trials_leave_a_param_the_trial_did_not_train_with_blank():
    """Every config key is a param of a trial's run; the table shows only those its ``active_params`` tag names, and for
    a run recorded before the tag, those that apply to its loss and schedules: an ICE trial's alpha and heating and a
    softmax trial's ice_scale are blank, as in trials.csv. A param that is no config key (a variant's name) is shown."""
    defaults = {"alpha": "16.0", "heating": "two_stage", "heating_target": "4.0", "ice_scale": "64.0", "lr_schedule": "step"}
    tag = "loss,ice_scale,lr,lr_schedule"
    ice = trial_run("ice", {**defaults, "loss": "ice", "ice_scale": "32.0", "lr": "0.01", "variant": "a"}, active_params=tag)
    softmax = trial_run("sm", {**defaults, "loss": "softmax", "alpha": "8.0", "lr": "0.02", "variant": "b"})  # no tag: from its params
    plain = trial_run("plain", {**defaults, "loss": "softmax", "heating": "none", "lr": "0.03", "variant": "c"})  # heating none: no target
    histories = {"ice": {1: 0.9}, "sm": {1: 0.8}, "plain": {1: 0.7}}
    states = dict.fromkeys(histories, "COMPLETE")
    text = markdown(top_trials([ice, softmax, plain], histories, states, "val_recall_at_1", "max", 10))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    table = [dict(zip(rows[0], row)) for row in rows[1:]]
    assert rows[0] == ["trial", "val_recall_at_1", "epochs", "alpha", "heating", "heating_target", "ice_scale", "loss", "lr", "variant"]
    assert table[0] == {**table[0], "alpha": "", "heating": "", "heating_target": "", "ice_scale": "32", "variant": "a"}
    assert table[1] == {**table[1], "alpha": "8", "heating": "two_stage", "heating_target": "4", "ice_scale": "", "variant": "b"}
    assert table[2] == {**table[2], "alpha": "16", "heating": "none", "heating_target": "", "ice_scale": "", "variant": "c"}
    assert "A blank cell: a parameter the trial did not train with" in text


def test_importances_are_computed_per_loss_family_and_the_page_says_on_which_trials(tmp_path):
    """Issue 32: fANOVA over a study of both losses ranked ice_scale on the ICE trials alone beside the softmax ones.
    Here a softmax trial's score is a function of alpha alone, an ICE trial's of ice_scale alone, lr is noise in both:
    each family's panel ranks its own parameter first with nearly all the importance, and names no parameter of the
    other loss (and not the loss, one value within a family)."""
    from study.records.artifacts import family_importances
    from study.records.study_record import StudyRecord

    storage = f"journal:{tmp_path / 'optuna.log'}"
    study = optuna.create_study(study_name="fam", direction="maximize", storage=open_storage(storage))
    loss = optuna.distributions.CategoricalDistribution(["softmax", "ice"])
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    alpha, scale = optuna.distributions.FloatDistribution(2, 64, log=True), optuna.distributions.FloatDistribution(4, 128, log=True)
    lrs = [3e-4, 1e-3, 5e-3, 2e-4, 8e-3, 6e-4, 2e-3, 4e-3]
    for i, (a, s) in enumerate(zip([2, 4, 8, 16, 32, 64, 3, 24], [4, 8, 16, 32, 64, 128, 6, 48])):
        params = {"loss": "softmax", "alpha": float(a), "lr": lrs[i]}
        study.add_trial(optuna.trial.create_trial(params=params, distributions={"loss": loss, "alpha": alpha, "lr": lr}, value=a / 100))
        params = {"loss": "ice", "ice_scale": float(s), "lr": lrs[-1 - i]}
        study.add_trial(
            optuna.trial.create_trial(params=params, distributions={"loss": loss, "ice_scale": scale, "lr": lr}, value=1 - s / 200)
        )
    families = family_importances(study)
    assert list(families) == ["loss softmax: 8 complete trials", "loss ice: 8 complete trials"]
    softmax, ice = families.values()
    assert set(softmax) == {"alpha", "lr"} and set(ice) == {"ice_scale", "lr"}
    assert softmax["alpha"] > 0.75 > softmax["lr"] and ice["ice_scale"] > 0.75 > ice["lr"], families  # fANOVA on 8 trials: an estimate

    parent = SimpleNamespace(info=SimpleNamespace(run_id="p"), data=SimpleNamespace(tags={"study_name": "fam"}))
    record = StudyRecord.from_params(recorded_params(optuna_storage=storage))
    text = markdown(importance_section(None, parent, record, tmp_path))
    assert "### loss softmax: 8 complete trials" in text and "### loss ice: 8 complete trials" in text
    assert "Computed per loss family, on its complete trials" in text
    assert "optuna-dashboard's Hyperparameter Importance pools the trials of both families" in text  # which trials each page uses
    assert text.index("| alpha |") < text.index("### loss ice") < text.index("| ice_scale |")
    assert (tmp_path / "param_importances.png").is_file()


@pytest.mark.parametrize("final_epochs, said", [(6, True), (3, False)])
def test_the_picked_config_says_the_budget_study_final_trains_it_to(tmp_path, runs, final_epochs, said):
    """best_config.yaml holds the trials' budget (3 epochs); a study whose final_epochs is 6 retrains it for 6 (issue 32:
    "epochs: 16" shown as what study.final --study retrains, which trained 32)."""
    uri = write_study_records(tmp_path, f"journal:{tmp_path / 'optuna.log'}", parent_params={"final_epochs": final_epochs})
    client = mlflow.MlflowClient(uri)
    parent = client.search_runs([client.get_experiment_by_name("dml-studies").experiment_id], "tags.kind = 'study'")[0]
    (tmp_path / "best_config.yaml").write_text(yaml.safe_dump({"lr": 0.01, "epochs": 3}))
    client.log_artifact(parent.info.run_id, str(tmp_path / "best_config.yaml"))
    out = tmp_path / "report"
    assert report.main(["--study", "hand", "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    text = (out / "report.md").read_text()
    assert "The best trial's config (`best_config.yaml`, what `study.final --study` retrains" in text
    assert ("retrains for 6 epochs (its epochs below are the trials' budget" in text) == said


def test_the_finals_section_names_the_latest_finished_ensemble_of_the_study(tmp_path, runs):
    """The seeds as one model is the final model: the report gives its metrics (%) from the latest ensemble run that
    finished (a later one that was killed is not it), and nothing when the study's final had one seed."""
    uri = write_study_records(tmp_path, f"journal:{tmp_path / 'optuna.log'}")
    client = mlflow.MlflowClient(uri)
    parent = [r for r in all_runs(uri)[1] if r.data.tags.get("kind") == "study"][0]
    assert ensemble_line(client, parent) == []
    for name, recall, status in (("old", 0.81234, "FINISHED"), ("new", 0.86789, "FINISHED"), ("cut", 0.9, "KILLED")):
        tags = {"mlflow.parentRunId": parent.info.run_id, "kind": "final_ensemble", "seeds": "0 1 2"}
        run = client.create_run(parent.info.experiment_id, run_name=f"final-hand-{name}", tags=tags).info.run_id
        client.log_metric(run, "test_recall_at_1", recall)
        client.log_metric(run, "test_map_at_r", 0.5)
        client.set_terminated(run, status)
    text = markdown(ensemble_line(client, parent))
    assert (
        "The final model, seeds 0, 1, 2 as one model (their embeddings side by side), run `final-hand-new`: R@1 86.8, MAP@R 50.0 (%)."
        in text
    )
    # a final of the race's tie (study.final --members tied) names each candidate with its seed
    tags = {"mlflow.parentRunId": parent.info.run_id, "kind": "final_ensemble", "seeds": "0 1 2", "trials": "4 7 4"}
    client.set_terminated(client.create_run(parent.info.experiment_id, run_name="final-hand-tie", tags=tags).info.run_id)
    text = markdown(ensemble_line(client, parent))
    assert r"The final model, the race's tied candidates \#4 (seed 0), \#7 (seed 1), \#4 (seed 2) as one model" in text  # '#' escaped
