"""Runtime settings reach the trials: a relative data root works although Tune runs trials in their own folders."""

from __future__ import annotations

import pytest
import yaml

from study.launch import cli as launch
from tests.test_launch import study_records

pytestmark = pytest.mark.slow


def test_relative_data_root_reaches_the_trials(tmp_path, runs, monkeypatch):
    """Tune runs each trial in its own working directory: a relative --data-root must still find the data."""
    from tests.test_final import make_folder_dataset

    make_folder_dataset(tmp_path / "data", corrupt=False)
    space = {
        "fixed": {
            "dataset": "folder",
            "image_size": 32,
            "epochs": 1,
            "classes_per_batch": 2,
            "samples_per_class": 2,
            "embedding_dim": 8,
            "val_fraction": 0.34,
        },
        "params": {"lr": {"type": "float", "low": 0.001, "high": 0.002}},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    monkeypatch.chdir(tmp_path)
    code = launch.main(
        ["--space", "space.yaml", "--data-root", "data", "--num-samples", "1", "--grace-period", "1", "--study-name", "relative"]
    )
    assert code == 0
    _, parent, children, study = study_records(runs, "relative")
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    assert children[0].info.status == "FINISHED" and children[0].data.metrics["val_recall_at_1"] >= 0
