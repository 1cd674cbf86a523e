"""One winner everywhere (issue 32): after a real study (a rehearsal), the pick is the same trial in Optuna, on the
MLflow parent run (tag, description), on the picked trial's run and in best_config.yaml; every training run names the
params it trained with; the study's closing lines name the report command."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from study import console
from study.launch import cli as launch
from study.records.ending import StudySummary
from study.report import cli as report
from tests.conftest import wait_for
from tests.test_launch import study_records, use_runs

pytestmark = pytest.mark.slow

STUDY = "winner"
METRIC = "val_recall_at_1"
# the keys of the other loss (trainables.core.config.LOSS_KEYS, written out here): never active in a trial of that loss
SOFTMAX_ONLY = {"alpha", "learn_alpha", "heating", "heating_target", "heating_start", "weight_norm", "mean_proxy_weight"}
# unused by every trial of the smoke space: adam (no momentum), the fc embedding (no dropout)
UNUSED_BY_SMOKE = {"momentum", "dropout"}


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory, store_template):
    """A smoke rehearsal of 4 trials of 4 epochs (the top 3 re-run with one extra seed): its runs folder and its terminal output."""
    runs = tmp_path_factory.mktemp("winner") / "runs"
    runs.mkdir()
    shutil.copyfile(store_template, runs / "mlflow.db")
    restore = use_runs(runs)
    out = io.StringIO()
    argv = ["--rehearse", "0", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "4", "--epochs", "4", "--study-name", STUDY]
    try:
        with contextlib.redirect_stdout(out):
            assert launch.main(argv) == 0
    finally:
        restore()
    return runs, out.getvalue()


@pytest.fixture(scope="module")
def reported(rehearsed, tmp_path_factory):
    """``python -m study.report`` of the rehearsal, logged to its parent run: the report's folder."""
    runs, _ = rehearsed
    out = tmp_path_factory.mktemp("winner-report") / "report"
    assert report.main(["--study", STUDY, "--tracking-uri", f"sqlite:///{runs / 'mlflow.db'}", "--out", str(out)]) == 0
    return out


def last(client, run) -> float:
    return max(client.get_metric_history(run.info.run_id, METRIC), key=lambda m: m.step).value


@pytest.mark.faults
def test_the_pick_is_one_trial_in_optuna_on_the_parent_run_and_on_its_own_run(rehearsed):
    runs, _ = rehearsed
    client, parent, children, study = study_records(runs, STUDY)
    parent = parent[0]
    experiment = parent.info.experiment_id
    # by hand: each re-run trial's scores are its own last score and its re-run's; the pick is the best mean
    reruns = client.search_runs([experiment], f"tags.study_name = '{STUDY}' and tags.kind = 'confirmation'")
    by_number = {int(r.data.tags["optuna_trial_number"]): r for r in children}
    confirms = {int(r.data.tags["confirms_optuna_trial"]): r for r in reruns}
    scores = {n: [last(client, by_number[n]), last(client, r)] for n, r in confirms.items()}
    assert len(scores) == 3 and all(len(s) == 2 for s in scores.values())
    pick = max(scores, key=lambda n: sum(scores[n]) / 2)
    mean, sem = sum(scores[pick]) / 2, abs(scores[pick][0] - scores[pick][1]) / 2  # the standard error of two: |a - b| / 2
    picked_run = by_number[pick]

    assert study.user_attrs["picked_trial"] == pick
    assert study.user_attrs["picked_confirmation_mean"] == pytest.approx(mean)
    assert parent.data.tags["picked_run"] == picked_run.info.run_id
    assert [r.info.run_id for r in children if r.data.tags.get("picked") == "true"] == [picked_run.info.run_id]
    best = yaml.safe_load(open(client.download_artifacts(parent.info.run_id, "best_config.yaml", str(runs.parent))))
    assert best["loss"] == picked_run.data.params["loss"] and str(best["lr"]) == picked_run.data.params["lr"]

    note = parent.data.tags["mlflow.note.content"]  # the run's description in MLflow's UI, the essentials first
    first, final, files = note.split("\n\n")
    assert first.startswith(f"**Pick of study {STUDY}: {picked_run.info.run_name}** (Optuna trial {pick}, loss `{best['loss']}`)")
    assert f"mean {mean:.4f} ± {sem:.4f} (standard error) over 2 validation folds" in first
    assert first.endswith(f"; {parent.data.tags['pick_verdict']}.")
    assert final.startswith(f"Retrain and test it: `python -m study.final --study {STUDY}` (4 epochs;")  # smoke: final_budget_factor 1
    assert f"`python -m study.report --study {STUDY}`" in files


@pytest.mark.faults
def test_optuna_dashboard_as_the_readme_runs_it_shows_the_pick(rehearsed):
    """README's command, ``optuna-dashboard runs/optuna/journal.log``, with the tool the README's install puts in the
    environment (the dev extra): its study page's user attributes name the picked trial and its mean over validation folds."""
    runs, _ = rehearsed
    _, _, _, study = study_records(runs, STUDY)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    tool = Path(sys.executable).parent / "optuna-dashboard"
    argv = [str(tool), str(runs / "optuna" / "journal.log"), "--host", "127.0.0.1", "--port", str(port), "--server", "wsgiref"]
    dashboard = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5):
                    return True
            except OSError:
                return False

        wait_for(answers, 60, "optuna-dashboard to answer", process=dashboard)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=30) as page:
            listed = json.load(page)["study_summaries"]
        study_id = next(s["study_id"] for s in listed if s["study_name"] == STUDY)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study_id}?after=0", timeout=30) as page:
            detail = json.load(page)
        shown = {attr["key"]: attr["value"] for attr in detail["user_attrs"]}
    finally:
        dashboard.terminate()
        dashboard.wait(30)
    assert shown["picked_trial"] == str(study.user_attrs["picked_trial"])
    assert float(shown["picked_confirmation_mean"]) == pytest.approx(study.user_attrs["picked_confirmation_mean"])
    # the study's note names the pick and how the dashboard's Best Trial badge (the best single score) relates to it
    note = detail["note"]["body"]
    assert note.startswith(f"## The study's pick: trial {study.user_attrs['picked_trial']}\n"), note
    single = max((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    if single.number != study.user_attrs["picked_trial"]:
        assert f"The Best Trial badge marks trial {single.number}, the best single score" in note
    else:
        assert "It is also the best single score" in note
    assert "Hyperparameter Importance here pools every complete trial, of every loss" in note  # the report's are per loss


@pytest.mark.faults
def test_every_training_run_names_the_params_it_trained_with(rehearsed):
    runs, _ = rehearsed
    client, parent, children, _ = study_records(runs, STUDY)
    reruns = client.search_runs([parent[0].info.experiment_id], f"tags.study_name = '{STUDY}' and tags.kind = 'confirmation'")
    for run in [*children, *reruns]:
        params, active = run.data.params, set(run.data.tags["active_params"].split(","))
        assert active <= set(params)
        unused = UNUSED_BY_SMOKE | ({"ice_scale"} if params["loss"] == "softmax" else SOFTMAX_ONLY)
        assert active == set(params) - unused, run.info.run_name


@pytest.mark.faults
def test_the_report_of_the_study_leaves_the_params_a_trial_did_not_train_with_blank(rehearsed, reported):
    runs, _ = rehearsed
    client, _, children, _ = study_records(runs, STUDY)
    out = reported
    text = (out / "report.md").read_text()
    assert "The x axis is the epoch of each trial's schedule, as MLflow's steps are" in text  # the curves' steps
    section = text.split(f"## Top trials by {METRIC}\n")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    by_name = {r.info.run_name: r for r in children}
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    assert rows and "ice_scale" in header
    # epochs: the budget of the schedule each (complete) trial finished, its MLflow steps 1 to 4 (the retrained one apart)
    steps = {len(client.get_metric_history(by_name[row[0]].info.run_id, METRIC)) for row in rows}
    assert {row[2] for row in rows} == {"4"} and steps == {4}
    for row in rows:
        run = by_name[row[0]]
        active = run.data.tags["active_params"].split(",")
        for name, cell in zip(header[3:], row[3:]):
            assert (cell == "") == (name not in active), (row[0], name, cell)


@pytest.mark.faults
def test_trials_csv_gives_the_schedule_each_trial_finished(rehearsed, tmp_path):
    """Budgets 1 and 4: a complete trial finished the 4-epoch schedule, a pruned one the 1-epoch one; a param a trial
    did not sample is blank (ICE: no alpha; softmax: no ice_scale)."""
    runs, _ = rehearsed
    client, parent, _, study = study_records(runs, STUDY)
    rows = list(csv.DictReader(open(client.download_artifacts(parent[0].info.run_id, "trials.csv", str(tmp_path)))))
    assert [int(r["number"]) for r in rows] == [t.number for t in study.trials]
    for row in rows:
        assert row["epochs"] == {"COMPLETE": "4", "PRUNED": "1"}[row["state"]], row
        # Optuna's attrs: the schedule's epochs reached (its MLflow steps), and all it trained (budget 4 from scratch)
        assert (row["user_attrs_epochs"], row["user_attrs_epochs_trained"]) == {"COMPLETE": ("4", "5"), "PRUNED": ("1", "1")}[row["state"]]
        assert (row["params_alpha"] == "") == (row["params_loss"] == "ice")
        assert (row["params_ice_scale"] == "") == (row["params_loss"] == "softmax")


@pytest.mark.faults
def test_the_closing_lines_name_the_report_command_beside_the_final_one(rehearsed):
    _, out = rehearsed
    flags = f"--study {STUDY} --experiment dml-studies"
    lines = out.splitlines()
    final = next(i for i, line in enumerate(lines) if line.endswith(f"{console.python_command('study.final')} {flags}"))
    reported = next(i for i, line in enumerate(lines) if line.endswith(f"{console.python_command('study.report')} {flags}"))
    ui = next(i for i, line in enumerate(lines) if line.startswith("open the MLflow UI at the study's runs, the pick first:"))
    assert final < reported < ui


def test_a_study_with_nothing_to_retrain_still_names_its_report(runs, capsys):
    metrics = {"wall_time_s": 5.0, "n_trials": 2, "n_complete": 0, "n_pruned": 0, "n_failed": 2, "epochs_spent": 0.0}
    named = {"study_name": "s", "uri": "http://10.0.0.1:5000", "experiment": "e"}
    console.print_study_summary(StudySummary(metrics, None, None, **named), METRIC)
    out = capsys.readouterr().out
    assert "nothing to retrain" in out and "study.final" not in out
    assert f"{console.python_command('study.report')} --study s --experiment e --tracking-uri http://10.0.0.1:5000\n" in out


@pytest.mark.faults
def test_the_study_holds_each_plot_once_and_the_report_draws_the_same(rehearsed, reported, tmp_path):
    """Issue 32: learning_curves.png, param_importances.png and parallel_coordinate.png at the parent run's root, and
    other drawings of them under report/. The study ends with the report's drawings; study.report logs no second copy,
    and the PNGs in its folder (which report.md shows) are byte for byte the study's."""
    runs, _ = rehearsed
    client, parent, _, _ = study_records(runs, STUDY)
    run_id = parent[0].info.run_id
    out = reported
    root = {a.path for a in client.list_artifacts(run_id) if a.path.endswith(".png")}
    logged = {a.path for a in client.list_artifacts(run_id, "report")}
    plots = {"learning_curves.png", "param_importances.png", "parallel_coordinate.png"}
    assert plots | {"optimization_history.png"} == root
    assert {"report/report.md", "report/report.html"} <= logged and not {f"report/{name}" for name in plots} & logged
    for name in plots:
        stored = client.download_artifacts(run_id, name, str(tmp_path))
        assert open(stored, "rb").read() == (out / name).read_bytes(), name
