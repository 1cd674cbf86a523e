"""A report of thousands of trials (issue 27): the metric histories read at once (tracking.metric_histories, against
MLflow's own per-run read), and fANOVA on a seeded sample of a large loss family."""

from __future__ import annotations

import math

import mlflow
import optuna
from mlflow.entities import Metric

from study.records import artifacts, tracking


def as_set(metrics: list) -> set[tuple]:
    return {(m.key, "nan" if math.isnan(m.value) else m.value, m.timestamp, m.step) for m in metrics}


def test_one_read_of_a_local_store_gives_what_the_client_gives_run_by_run(runs):
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.create_experiment("h", artifact_location=(runs / "artifacts" / "h").as_uri())
    run_ids = []
    for i in range(7):
        run_id = client.create_run(experiment).info.run_id
        run_ids.append(run_id)
        metrics = [Metric("val", 0.1 * s + i, 1000 + s, s) for s in range(1, 4)]
        metrics += [Metric("val", 0.9, 2000, 2), Metric("budget", 4.0, 1000, 1), Metric("loss", float("nan"), 1000, 1)]
        metrics += [Metric("other", 1.0, 1000, 1)]  # not asked for
        if i != 3:  # one run without a NaN and without a budget
            client.log_batch(run_id, metrics=metrics)
        else:
            client.log_batch(run_id, metrics=metrics[:3])
    keys = ["val", "budget", "loss"]
    got = tracking.metric_histories(client, run_ids, keys)
    assert set(got) == {(r, k) for r in run_ids for k in keys}
    for (run_id, key), metrics in got.items():
        assert as_set(metrics) == as_set(client.get_metric_history(run_id, key)), (run_id, key)
    assert got[run_ids[3], "budget"] == [] and len(got[run_ids[0], "val"]) == 4  # step 2 logged twice: both kept
    assert math.isnan(got[run_ids[0], "loss"][0].value)


class ServerClient:
    """A client of a tracking server: its reads are counted, one per run and key."""

    tracking_uri = "http://127.0.0.1:5000"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def get_metric_history(self, run_id: str, key: str) -> list:
        self.calls.append((run_id, key))
        return [Metric(key, 1.0, 0, 1)]


def test_a_server_store_is_read_through_the_client_run_by_run():
    client = ServerClient()
    got = tracking.metric_histories(client, ["a", "b"], ["val", "epoch"])
    assert sorted(client.calls) == [("a", "epoch"), ("a", "val"), ("b", "epoch"), ("b", "val")]
    assert all(len(v) == 1 for v in got.values())


def test_a_loss_family_larger_than_fanovas_share_is_judged_on_a_seeded_sample_and_says_so(monkeypatch):
    monkeypatch.setattr(artifacts, "FANOVA_TRIALS", 6)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(9):  # the score depends on lr alone
        trial = study.ask()
        lr, width = trial.suggest_float("lr", 1e-4, 1e-1, log=True), trial.suggest_int("width", 8, 64)
        study.tell(trial, -abs(math.log10(lr) + 2.5) + 0 * width)
    first, again = artifacts.family_importances(study), artifacts.family_importances(study)
    assert list(first) == ["all 6 of 9 complete trials (a seeded sample)"] and first == again  # seeded: the same sample
    importances = first["all 6 of 9 complete trials (a seeded sample)"]
    assert max(importances, key=importances.get) == "lr"
    monkeypatch.setattr(artifacts, "FANOVA_TRIALS", 9)
    assert list(artifacts.family_importances(study)) == ["all 9 complete trials"]  # at the share: every trial
