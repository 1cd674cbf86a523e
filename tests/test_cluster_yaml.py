"""Tests of cluster.yaml, the `ray up` config.

The config goes through Ray's own cluster-config path as `ray up` runs it
(ray.autoscaler._private.commands._bootstrap_config): yaml.safe_load, prepare_config
(merges the provider's defaults.yaml and the setup commands) and validate_config
(ray-schema.json plus Ray's cross-field checks). The provider bootstrap that follows in
`ray up` calls AWS and is not run: nothing here needs credentials or a network.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"

# The key order of Ray's cluster YAML examples (docker is left out here).
STANDARD_ORDER = [
    "cluster_name",
    "max_workers",
    "upscaling_speed",
    "docker",
    "idle_timeout_minutes",
    "provider",
    "auth",
    "available_node_types",
    "head_node_type",
    "file_mounts",
    "cluster_synced_files",
    "file_mounts_sync_continuously",
    "rsync_exclude",
    "rsync_filter",
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
]


def load() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def ray_validate(config: dict) -> dict:
    """What `ray up` does with the loaded YAML before it talks to the cloud provider."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture(scope="module")
def text() -> str:
    return CLUSTER_YAML.read_text()


@pytest.fixture(scope="module")
def config() -> dict:
    return load()


@pytest.fixture(scope="module")
def prepared(config) -> dict:
    return ray_validate(config)


def head_type(config: dict) -> dict:
    return config["available_node_types"][config["head_node_type"]]


def worker_types(config: dict) -> dict[str, dict]:
    return {name: t for name, t in config["available_node_types"].items() if name != config["head_node_type"]}


def command_with(commands: list[str], needle: str) -> str:
    found = [c for c in commands if needle in c]
    assert len(found) == 1, f"expected exactly one command containing {needle!r}, found {found}"
    return found[0]


# -- Ray's validator ----------------------------------------------------------------------------


def test_rays_validator_accepts_the_config(prepared):
    assert prepared["provider"]["type"] == "aws"
    # prepare_config really ran: the common setup commands now open the head's list.
    assert prepared["head_setup_commands"][: len(load()["setup_commands"])] == load()["setup_commands"]


@pytest.mark.parametrize(
    "break_it",
    [
        pytest.param(lambda c: c.update(max_workers="many"), id="max_workers-not-an-integer"),
        pytest.param(lambda c: c.update(unknown_top_level_key=True), id="unknown-top-level-key"),
        pytest.param(lambda c: c["available_node_types"]["gpu_worker"]["resources"].update(GPU="one"), id="GPU-not-an-integer"),
        pytest.param(lambda c: c["available_node_types"]["gpu_worker"].pop("resources"), id="node-type-without-resources"),
        pytest.param(lambda c: c["auth"].update(ssh_pasword="x"), id="misspelled-auth-key"),
    ],
)
def test_rays_validator_rejects_a_broken_copy(config, break_it):
    broken = copy.deepcopy(config)
    break_it(broken)
    with pytest.raises(jsonschema.ValidationError):
        ray_validate(broken)


def test_rays_cross_field_checks_run(config):
    broken = copy.deepcopy(config)
    broken["head_node_type"] = "no_such_type"
    with pytest.raises(ValueError, match="head_node_type"):
        ray_validate(broken)
    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu_worker"]["min_workers"] = broken["max_workers"] + 1
    with pytest.raises(ValueError, match="max_workers"):
        ray_validate(broken)


def test_keys_follow_rays_standard_order(config):
    keys = list(config)
    assert set(keys) <= set(STANDARD_ORDER), set(keys) - set(STANDARD_ORDER)
    assert keys == [k for k in STANDARD_ORDER if k in keys]


# -- nodes ----------------------------------------------------------------------------------------


def test_head_runs_no_trials(config, prepared):
    head = head_type(config)
    assert head["resources"].get("CPU") == 0
    assert head["resources"].get("GPU", 0) == 0
    assert prepared["available_node_types"][config["head_node_type"]]["max_workers"] == 0


def test_one_gpu_worker_type_with_explicit_resources(config):
    workers = worker_types(config)
    assert len(workers) == 1
    (worker,) = workers.values()
    assert worker["resources"]["GPU"] >= 1
    assert isinstance(worker["resources"]["CPU"], int) and worker["resources"]["CPU"] >= 1
    assert 1 <= worker["min_workers"] <= worker["max_workers"] <= config["max_workers"]
    # Trials write checkpoints to S3 from the workers, so they carry an instance profile.
    assert "IamInstanceProfile" in worker["node_config"]


def test_all_nodes_run_the_same_image(config):
    images = {t["node_config"]["ImageId"] for t in config["available_node_types"].values()}
    assert len(images) == 1


# -- services bound to localhost ------------------------------------------------------------------


def test_mlflow_server_is_bound_to_localhost(config, prepared):
    cmd = shlex.split(command_with(config["head_start_ray_commands"] + config["head_setup_commands"], "mlflow server"))
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "5000"
    assert cmd[cmd.index("--backend-store-uri") + 1].startswith("sqlite:////")
    assert cmd[cmd.index("--artifacts-destination") + 1] == "$DML_STORAGE/mlflow"
    assert "http://127.0.0.1:5000" in " ".join(prepared["head_setup_commands"])
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in " ".join(config["head_setup_commands"])


def test_mlflow_server_starts_no_job_runner(config):
    cmd = shlex.split(command_with(config["head_start_ray_commands"], "mlflow server"))
    assert cmd[cmd.index("mlflow") - 2 : cmd.index("mlflow")] == ["env", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false"]


def test_dashboard_is_bound_to_localhost(config):
    cmd = command_with(config["head_start_ray_commands"], "ray start --head")
    assert "--dashboard-host=127.0.0.1" in cmd


def test_nothing_listens_on_all_interfaces(text):
    assert "0.0.0.0" not in text


# -- no credentials -------------------------------------------------------------------------------


def test_no_credentials_in_the_file(text, config):
    assert not re.search(r"AKIA[0-9A-Z]{16}", text)
    lowered = text.lower()
    for word in ("aws_secret_access_key", "aws_access_key_id", "password", "token:", "ssh_private_key"):
        assert word not in lowered, word
    assert config["auth"] == {"ssh_user": "ubuntu"}


# -- setup ----------------------------------------------------------------------------------------


def test_setup_installs_this_project(config):
    remote = next(r for r, local in config["file_mounts"].items() if local == ".")
    install = command_with(config["setup_commands"], "pip install -q -e")
    assert re.search(rf"pip install (-\S+ )*-e {re.escape(remote)}(\s|$)", install), install


def test_cluster_runs_the_ray_of_the_launcher(config):
    install = command_with(config["setup_commands"], "pip install -q -e")
    pinned = re.search(r"ray\[[^\]]*\]==([0-9][^\"'\s]*)", install)
    assert pinned, "ray is pinned in the setup commands"
    assert pinned.group(1) == ray.__version__, "cluster.yaml pins another Ray than the one that runs `ray up`"


def test_data_root_is_set_on_every_node(config):
    assert re.search(r"export DML_DATA_ROOT=\S+", " ".join(config["setup_commands"]))


def test_storage_is_an_s3_uri(config):
    found = re.findall(r"DML_STORAGE=\"?([^\"'\s]+)", " ".join(config["setup_commands"]))
    assert len(found) == 1, "DML_STORAGE is set in exactly one place"
    assert found[0].startswith("s3://")
    assert "CHANGE-ME" in found[0]
