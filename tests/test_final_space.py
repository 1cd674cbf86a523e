"""study.final --space: the configurations of a grid or variants space, their names, and bad input.

The end-to-end run of a tiny grid (with the report it feeds) is in tests/test_report.py.
"""

from __future__ import annotations

import mlflow
import pytest
import yaml

from study.final import cli as final
from study.final.plan import space_configs
from tests.conftest import ROOT


def all_runs(uri):
    client = mlflow.MlflowClient(uri)
    experiments = client.search_experiments()
    return client, client.search_runs([e.experiment_id for e in experiments]) if experiments else []


def test_space_configs_of_a_grid_space_are_named_key_value(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "fixed": {"dataset": "synthetic", "epochs": 3, "embedding_dim": 16},
                "grid": {"alpha": [4.0, 16.0], "samples_per_class": [2, 4]},
            }
        )
    )
    configs, name = space_configs(str(path), epochs=1)
    assert name == "g"
    expected = {
        "alpha=4.0,samples_per_class=2": (4.0, 2),
        "alpha=4.0,samples_per_class=4": (4.0, 4),
        "alpha=16.0,samples_per_class=2": (16.0, 2),
        "alpha=16.0,samples_per_class=4": (16.0, 4),
    }
    assert {n: (c.alpha, c.samples_per_class) for n, c in configs} == expected
    assert all(c.epochs == 1 and c.embedding_dim == 16 and c.dataset == "synthetic" for _, c in configs)


def test_space_configs_of_a_variants_space_are_named_by_variant():
    configs, name = space_configs("paper_ablation", epochs=None)
    assert name == "paper_ablation"
    by_name = dict(configs)
    assert list(by_name) == ["SM", "LN", "BN", "HLN", "HBN"]  # the file's order
    assert (by_name["SM"].normalization, by_name["SM"].alpha, by_name["SM"].heating) == ("none", 1.0, "none")
    assert (by_name["HBN"].normalization, by_name["HBN"].heating, by_name["HBN"].heating_target) == ("bn", "two_stage", 4.0)
    assert all(c.epochs == 30 for c in by_name.values())  # the space's own epochs without --epochs


@pytest.mark.parametrize("space", [str(ROOT / "search_spaces" / "smoke.yaml"), "smoke", "no_such_space_file.yaml"])
def test_final_space_bad_input_exits_2_without_a_run(tmp_path, runs, capsys, space):
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    code = final.main(["--space", space, "--seeds", "1", "--epochs", "1", "--tracking-uri", uri])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert all_runs(uri)[1] == []  # not even a parent run


def test_final_space_excludes_config():
    with pytest.raises(SystemExit) as exit_info:
        final.parse_args(["--space", "paper_ablation", "--config", "x.yaml"])
    assert exit_info.value.code == 2
