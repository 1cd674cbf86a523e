"""The one name rule (study/names.py) at every name flag of every command, and MLflow filters that a value cannot escape.

Issue 33, finding 3: ``study.final --study "base' and tags.kind != 'x"`` matched study ``base`` through MLflow's
search filter, retrained it and registered a model under the injected name; a plain quote was a traceback in
study.final and study.sync. Each hostile name below must end in one line ``error: FLAG ...``, exit status 2, with
nothing created in MLflow (no run, experiment or registered model) and no report written.
"""

from __future__ import annotations

import mlflow
import pytest

from study import names, sync
from study.final import cli as final
from study.final import train as final_train
from study.inputs import UsageError
from study.launch import cli as launch
from study.records import tracking
from study.report import cli as report
from tests.conftest import recorded_params
from tests.test_final import TINY

HOSTILE = ["base' and tags.kind != 'x", "base' or tags.kind = 'study", 'base" or "1" = "1', "it's", "a b", "x\n"]

COMMANDS = {  # command: (its main, a valid command line as {flag: value}, its name flags)
    "study.launch": (launch.main, {"--space": "smoke", "--rehearse": "0", "--num-samples": "1"}, ("--study-name", "--experiment")),
    "study.final": (final.main, {"--study": "base", "--seeds": "1"}, ("--study", "--experiment", "--register")),
    "study.sync": (sync.main, {"--study": "base"}, ("--study", "--experiment")),
    "study.report": (report.main, {"--study": "base", "--no-log": None}, ("--study", "--experiment")),
}


def two_studies(runs) -> mlflow.MlflowClient:
    """Studies "base" and "other", finished, each with a best_config.yaml, in the local store of ``runs``."""
    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment(tracking.DEFAULT_EXPERIMENT, artifact_location=(runs / "artifacts").as_uri())
    for name in ("base", "other"):
        run_id = client.create_run(experiment_id, run_name=name, tags={"study_name": name, "kind": "study"}).info.run_id
        params = recorded_params(optuna_storage=f"journal:{runs / 'optuna' / 'journal.log'}")
        client.log_batch(run_id, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
        client.log_dict(run_id, {**TINY, "epochs": 1}, "best_config.yaml")
        client.set_terminated(run_id)
    return client


def store_contents(client: mlflow.MlflowClient) -> tuple:
    experiments = client.search_experiments()
    run_ids = sorted(r.info.run_id for r in client.search_runs([e.experiment_id for e in experiments]))
    return sorted(e.name for e in experiments), run_ids, client.search_registered_models()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_quotes_and_operators_in_every_name_flag_are_one_line_and_exit_2(runs, capsys, monkeypatch, command):
    def nothing_may_train(*args, **kwargs):
        raise AssertionError("a command went on with a hostile name")

    monkeypatch.setattr(final_train, "train_seed", nothing_may_train)
    client = two_studies(runs)
    before = store_contents(client)
    main, valid, flags = COMMANDS[command]
    for flag in flags:
        for value in HOSTILE:
            given = {**valid, flag: value}
            argv = [part for key, v in given.items() for part in (key, v) if part is not None]
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code
            err = capsys.readouterr().err
            assert code == 2, (command, flag, value, err[-2000:])
            assert err.startswith(f"error: {flag} ") and err.count("\n") == 1, (command, flag, value, err[-2000:])
            assert store_contents(client) == before, (command, flag, value)
    assert not (runs / "reports").exists()


def test_the_name_rule():
    assert [n for n in ["base", "a.b_c-1", "S1", "x" * 100] if names.is_name(n)] == ["base", "a.b_c-1", "S1", "x" * 100]
    refused = ["", "x" * 101, "a/b", "..", "a..b", "-x", ".x", "_x", "x\n", "it's", 'a"b', "a b", "a\\b", "team/dml", "é"]
    assert [n for n in refused if names.is_name(n)] == []
    names.check_names({"--study": "base", "--experiment": None})  # a flag not given is not checked
    with pytest.raises(UsageError, match=r"^--experiment 'a b': expected a name of letters, digits"):
        names.check_names({"--study": "base", "--experiment": "a b"})


def test_run_filters_quote_every_value_and_refuse_what_could_end_a_quote():
    assert tracking.run_filter({"tags.study_name": "base", "tags.kind": "study"}) == "tags.study_name = 'base' and tags.kind = 'study'"
    for value in ["base' and tags.kind != 'x", 'a"b', "a\\b", "a\nb"]:
        with pytest.raises(UsageError, match="cannot be searched for"):
            tracking.run_filter({"tags.study_name": value})


def test_find_study_run_matches_only_the_study_named(runs):
    client = two_studies(runs)
    experiment_id = client.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT).experiment_id
    assert tracking.find_study_run(client, experiment_id, "base").data.tags["study_name"] == "base"
    assert tracking.find_study_run(client, experiment_id, "bas") is None
    with pytest.raises(UsageError):
        tracking.find_study_run(client, experiment_id, "x' or tags.kind = 'study")
