"""A study retrained more than once: its report's test table is the latest study.final's seeds alone; earlier finals
are listed apart, never averaged in."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from study.report.document import markdown
from study.report.finals import final_groups, study_finals


def seed_run(run_id: str, start: int, owner: str | None, epochs: int, recall: float):
    tags = {"kind": "final_seed", "mlflow.parentRunId": "parent"} | ({"owner_lock": owner} if owner else {})
    data = SimpleNamespace(tags=tags, params={"epochs": str(epochs)}, metrics={"test_recall_at_1": recall})
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, experiment_id="0", start_time=start), data=data)


def test_seed_runs_group_by_the_final_that_wrote_them_the_latest_last():
    first = [seed_run(f"a{i}", 10 + i, "/runs/locks/final-1.lock", 32, 0.8) for i in range(3)]
    second = [seed_run(f"b{i}", 100 + i, "/runs/locks/final-2.lock", 8, 0.5) for i in range(3)]
    untagged = [seed_run("old", 1, None, 16, 0.7)]  # a run recorded before finals were tagged with their process
    latest, earlier = final_groups([*untagged, *first, *second])
    assert [r.info.run_id for r in latest] == ["b0", "b1", "b2"]
    assert [[r.info.run_id for r in g] for g in earlier] == [["old"], ["a0", "a1", "a2"]]


class Client:
    """The MLflow calls study_finals makes, over fixed runs (seed runs, and seeds-as-one-model runs)."""

    def __init__(self, runs, ensembles=()):
        self.runs, self.ensembles = runs, list(ensembles)

    def search_runs(self, experiment_ids, filter_string="", order_by=None, max_results=None, page_token=None):
        if "final_ensemble" in filter_string:
            return Page(self.ensembles)
        return Page(self.runs if "final_seed" in filter_string else [])

    def get_metric_history(self, run_id, key):
        return []


class Page(list):
    token = None


def test_the_test_table_is_the_latest_finals_and_earlier_ones_are_listed_apart(tmp_path, monkeypatch):
    """Before: a later final at 8 epochs was averaged with the first at 32, "over 6 seed(s)"."""
    from study.report import finals

    monkeypatch.setattr(finals, "final_diagnostics", lambda client, groups, out, models=None: [])
    monkeypatch.setattr(finals, "ensemble_line", lambda client, parent: [])
    first = [seed_run(f"a{i}", 10 + i, "/runs/locks/final-1.lock", 32, 0.8) for i in range(3)]
    second = [seed_run(f"b{i}", 100 + i, "/runs/locks/final-2.lock", 8, 0.5) for i in range(3)]
    parent = SimpleNamespace(info=SimpleNamespace(run_id="parent", experiment_id="0"), data=SimpleNamespace(tags={"study_name": "s"}))
    text = markdown(study_finals(Client([*first, *second]), parent, tmp_path))
    assert "over 3 seed(s)" in text and "over 6 seed(s)" not in text
    assert "| R@1 | 50.0 ± 0.0 |" in text  # the latest final's three seeds, not the mean with the first's 80.0
    assert "Earlier finals of this study, not in the table: 3 seed(s) at 32 epochs (R@1 80.0)." in text


def test_a_final_of_the_races_tie_is_tabled_as_one_model_beside_each_members_own_scores(tmp_path, monkeypatch):
    """Seeds 0, 1, 2 trained the race's tied candidates #14 (the pick), #3 and #2, registered as one model: the table
    names the tie and gives the model's scores and each member's own, not "the best config" over 3 seeds."""
    from study.report import finals

    monkeypatch.setattr(finals, "final_diagnostics", lambda client, groups, out, models=None: [])
    seeds = [seed_run(f"s{i}", 10 + i, "/runs/locks/final-1.lock", 32, recall) for i, recall in enumerate((0.80, 0.82, 0.78))]
    for run, trial in zip(seeds, ("14", "3", "2"), strict=True):
        run.data.tags["optuna_trial"] = trial
    ensemble = seed_run("e", 20, "/runs/locks/final-1.lock", 32, 0.85)
    ensemble.data.tags.update(kind="final_ensemble", trials="14 3 2", seeds="0 1 2")
    ensemble.info.status, ensemble.info.run_name = "FINISHED", "final-s-ensemble"
    parent = SimpleNamespace(info=SimpleNamespace(run_id="parent", experiment_id="0"), data=SimpleNamespace(tags={"study_name": "s"}))
    text = markdown(study_finals(Client(seeds, [ensemble]), parent, tmp_path))
    assert r"| metric (%) | the race's tie \#14, \#3, \#2 as one model | \#14 alone (the pick) | \#3 alone | \#2 alone |" in text
    assert "| R@1 | **85.0 (n = 1)** | 80.0 (n = 1) | 82.0 (n = 1) | 78.0 (n = 1) |" in text
    assert "best config" not in text


class Artifacts:
    """download_artifacts of one parent run whose file (``selection.json``, ``best_config.yaml``) holds ``text``."""

    def __init__(self, text: str | None):
        self.text = text

    def download_artifacts(self, run_id, path, dst):
        if self.text is None:
            raise OSError("no such artifact")
        target = Path(dst) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.text)
        return str(target)


PARENT = SimpleNamespace(info=SimpleNamespace(run_id="parent"), data=SimpleNamespace(tags={"study_name": "s"}))


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", "JSONDecodeError"),
        ('"a string"', "TypeError"),
        ('{"ranking": [{"trial": 3}]}', "KeyError: 'scores'"),
        ("{}", "KeyError: 'ranking'"),
    ],
)
def test_a_hand_edited_selection_is_refused_naming_the_file(tmp_path, text, field):
    """Before: an unreadable selection.json was taken for no race at all (the report said nothing of the pick), and one
    missing a key ended the report in a KeyError traceback."""
    from study.inputs import UsageError
    from study.report.sections import recorded_selection

    with pytest.raises(UsageError, match=rf"^selection.json of study s: not the race's record the study writes \({field}"):
        recorded_selection(Artifacts(text), PARENT, tmp_path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a string", "expected a mapping of config keys, got str"),
        ("[1, 2]", "expected a mapping of config keys, got list"),
        ("lossy: 1", "unknown key 'lossy'"),
        ("lr: -1", "lr=-1.0 is not allowed"),
        ("loss: [softmax", "YAML syntax error"),
    ],
)
def test_a_hand_edited_best_config_is_refused_naming_the_file(tmp_path, text, why):
    """The report shows the config study.final --study retrains, so it reads it by the same rule. Before: a plain
    string or a list ended the report in an AttributeError traceback, and an unknown key or value was shown as the
    study's config."""
    from study.inputs import UsageError
    from study.report.sections import best_config

    with pytest.raises(UsageError, match=r"^best_config.yaml of study s(:\d+:\d+)?: ") as refused:
        best_config(Artifacts(text), PARENT, tmp_path)
    assert why in str(refused.value) and "\n" not in str(refused.value)
    shown = best_config(Artifacts("loss: ice\nice_scale: 32.0\nepochs: 4\n"), PARENT, tmp_path, final_epochs=8)
    assert "for 8 epochs" in shown[0].text[-1] and "ice_scale: 32.0" in shown[1].text


def test_a_study_without_a_race_has_no_selection(tmp_path):
    from study.report.sections import recorded_selection

    assert recorded_selection(Artifacts(None), PARENT, tmp_path) is None


def test_the_embedding_pictures_are_the_registered_models_where_it_has_them(tmp_path):
    """A final of several seeds registers them as one model: its retrieval grid and t-SNE map, not seed 0's."""
    from study.report.finals import embedding_section, slug

    class Pictures:
        def list_artifacts(self, run_id):
            return [SimpleNamespace(path=f"retrieval_grid_{run_id}.png"), SimpleNamespace(path=f"tsne_{run_id}.png")]

        def download_artifacts(self, run_id, path, dst):
            Path(dst).mkdir(parents=True, exist_ok=True)
            (Path(dst) / path).write_bytes(run_id.encode())
            return str(Path(dst) / path)

    seeds = [seed_run(f"seed{i}", 10 + i, None, 32, 0.8) for i in range(3)]
    for i, run in enumerate(seeds):
        run.data.tags["seed"] = str(i)
    model = seed_run("ensemble", 20, None, 32, 0.85)
    model.data.tags["seeds"] = "0 1 2"
    blocks = markdown(embedding_section(Pictures(), {"the final of s": seeds}, tmp_path, {"the final of s": model}))
    assert "the final of s (the registered model, seeds 0 1 2 as one), test queries" in blocks
    assert (tmp_path / f"retrieval_grid_{slug('the final of s')}.png").read_bytes() == b"ensemble"
    alone = markdown(embedding_section(Pictures(), {"the final of s": seeds}, tmp_path, {}))  # one seed: nothing registered as one
    assert "the final of s (seed 0), test queries" in alone and (tmp_path / f"tsne_{slug('the final of s')}.png").read_bytes() == b"seed0"
