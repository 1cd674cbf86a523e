"""Tests of cluster.yaml (AWS) and cluster.local.yaml (machines of your own), the `ray up` configs.

The configs go through Ray's own cluster-config path as `ray up` runs it
(ray.autoscaler._private.commands._bootstrap_config): yaml.safe_load, prepare_config
(merges the provider's defaults.yaml and the setup commands; for the on-premise provider,
prepare_local first) and validate_config (ray-schema.json plus Ray's cross-field checks).
The provider bootstrap that follows in `ray up` calls AWS and is not run: nothing here
needs credentials or a network. tests/test_cluster_hosts.py runs `ray up` of
cluster.local.yaml on three hosts; the commands of the two files differ only where the
on-premise provider requires (test_on_premise_commands_are_cluster_yamls_but_for_the_provider),
so that run also exercises cluster.yaml's commands.
"""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from click import ClickException
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
CLUSTER_LOCAL = ROOT / "cluster.local.yaml"
FILES = [CLUSTER_YAML, CLUSTER_LOCAL]

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


def load(path: Path = CLUSTER_YAML) -> dict:
    return yaml.safe_load(path.read_text())


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


@pytest.fixture(scope="module")
def local() -> dict:
    return load(CLUSTER_LOCAL)


@pytest.fixture(scope="module", params=FILES, ids=lambda path: path.name)
def either(request) -> dict:
    """Each shipped cluster file, loaded."""
    return load(request.param)


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


def test_keys_follow_rays_standard_order(either):
    keys = list(either)
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


def test_mlflow_server_is_bound_to_localhost(either):
    prepared = ray_validate(either)
    cmd = shlex.split(command_with(either["head_start_ray_commands"] + either["head_setup_commands"], "mlflow server"))
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "5000"
    # an absolute path: /home/ubuntu on AWS, the ssh user's $HOME (expanded by the head's shell) on your own machines
    assert re.fullmatch(r"sqlite:///(/home/ubuntu|\$HOME)/mlflow/mlflow\.db", cmd[cmd.index("--backend-store-uri") + 1])
    assert cmd[cmd.index("--artifacts-destination") + 1] == "$DML_STORAGE/mlflow"
    assert "http://127.0.0.1:5000" in " ".join(prepared["head_setup_commands"])
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in " ".join(either["head_setup_commands"])


def test_mlflow_server_starts_no_job_runner(either):
    cmd = shlex.split(command_with(either["head_start_ray_commands"], "mlflow server"))
    assert cmd[cmd.index("mlflow") - 2 : cmd.index("mlflow")] == ["env", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false"]


def test_dashboard_is_bound_to_localhost(either):
    cmd = command_with(either["head_start_ray_commands"], "ray start --head")
    assert "--dashboard-host=127.0.0.1" in cmd


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_nothing_listens_on_all_interfaces(path):
    assert "0.0.0.0" not in path.read_text()


# -- no credentials -------------------------------------------------------------------------------


def test_no_credentials_in_the_file(text, config):
    assert not re.search(r"AKIA[0-9A-Z]{16}", text)
    lowered = text.lower()
    for word in ("aws_secret_access_key", "aws_access_key_id", "password", "token:", "ssh_private_key"):
        assert word not in lowered, word
    assert config["auth"] == {"ssh_user": "ubuntu"}


# -- setup ----------------------------------------------------------------------------------------


def test_setup_installs_this_project(either):
    remote = next(r for r, local in either["file_mounts"].items() if local == ".")
    install = command_with(either["setup_commands"], "pip install -q -e")
    assert re.search(rf"pip install (-\S+ )*-e {re.escape(remote)}(\s|$)", install), install


def test_cluster_runs_the_ray_of_the_launcher(either):
    install = command_with(either["setup_commands"], "pip install -q -e")
    pinned = re.search(r"ray\[[^\]]*\]==([0-9][^\"'\s]*)", install)
    assert pinned, "ray is pinned in the setup commands"
    assert pinned.group(1) == ray.__version__, "the cluster file pins another Ray than the one that runs `ray up`"


def test_data_root_is_set_on_every_node(either):
    assert re.search(r"export DML_DATA_ROOT=\S+", " ".join(either["setup_commands"]))


def test_storage_is_an_s3_uri(config):
    found = re.findall(r"DML_STORAGE=\"?([^\"'\s]+)", " ".join(config["setup_commands"]))
    assert len(found) == 1, "DML_STORAGE is set in exactly one place"
    assert found[0].startswith("s3://")
    assert "CHANGE-ME" in found[0]


# -- cluster.local.yaml: machines of your own -----------------------------------------------------------------------


def test_rays_validator_accepts_the_on_premise_config(local):
    prepared = ray_validate(local)
    assert prepared["provider"]["type"] == "local"
    # prepare_local: one node type for head and workers, every listed worker kept up
    (node_type,) = prepared["available_node_types"].values()
    workers = len(local["provider"]["worker_ips"])
    assert node_type["min_workers"] == node_type["max_workers"] == prepared["max_workers"] == workers >= 1
    assert prepared["head_setup_commands"][: len(local["setup_commands"])] == local["setup_commands"]


@pytest.mark.parametrize(
    "break_it, error",
    [
        pytest.param(lambda c: c["provider"].pop("worker_ips"), ClickException, id="no-worker_ips"),
        pytest.param(lambda c: c.update(available_node_types={"gpu": {}}), ClickException, id="node-types-on-premise"),
        pytest.param(lambda c: c["auth"].update(ssh_pasword="x"), jsonschema.ValidationError, id="misspelled-auth-key"),
        pytest.param(lambda c: c.update(unknown_top_level_key=True), jsonschema.ValidationError, id="unknown-top-level-key"),
    ],
)
def test_rays_validator_rejects_a_broken_on_premise_copy(local, break_it, error):
    broken = copy.deepcopy(local)
    break_it(broken)
    with pytest.raises(error):
        ray_validate(broken)


def as_on_aws(config: dict) -> dict:
    """The commands and file sync of a cluster file, with DML_STORAGE's value blanked and the on-premise differences
    undone: what must be equal between the two files."""
    keys = ["file_mounts", "cluster_synced_files", "file_mounts_sync_continuously", "rsync_exclude", "rsync_filter"]
    keys += ["initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands"]
    keys += ["head_start_ray_commands", "worker_start_ray_commands"]
    c = copy.deepcopy({key: config[key] for key in keys})
    c["setup_commands"] = [re.sub(r'DML_STORAGE="[^"]*"', 'DML_STORAGE="..."', cmd) for cmd in c["setup_commands"]]
    if config["provider"]["type"] == "local":
        # 1. pip only when ~/venv lacks this project or the pinned Ray: `CHECK || { INSTALL; }`
        install = command_with(c["setup_commands"], "pip install -q -e")
        check, _, guarded = install.partition(" 2>/dev/null || ")
        assert guarded.startswith("{ ") and guarded.endswith("; }"), install
        c["setup_commands"][c["setup_commands"].index(install)] = guarded[2:-3]
        # 2. no node types on premise: the head's CPU 0 is a flag of its `ray start`
        start = command_with(c["head_start_ray_commands"], "ray start --head")
        assert start.endswith(" --num-cpus=0")
        c["head_start_ray_commands"][c["head_start_ray_commands"].index(start)] = start.removesuffix(" --num-cpus=0")
        # 3. the ssh user's home, not AWS's /home/ubuntu
        c["head_start_ray_commands"] = [cmd.replace("sqlite:///$HOME/", "sqlite:////home/ubuntu/") for cmd in c["head_start_ray_commands"]]
    return c


def test_on_premise_commands_are_cluster_yamls_but_for_the_provider(config, local):
    assert as_on_aws(local) == as_on_aws(config)


def test_on_premise_head_runs_no_trials(local):
    assert "--num-cpus=0" in shlex.split(command_with(local["head_start_ray_commands"], "ray start --head"))


def test_on_premise_install_check_reads_the_pinned_ray(local, tmp_path):
    """The check that skips pip passes for this environment (it has this project and the launcher's Ray) and fails
    for another pin or without the project."""
    install = command_with(local["setup_commands"], "pip install -q -e")
    check = install.partition(" 2>/dev/null || ")[0]
    assert check.startswith("~/venv/bin/python -c ")
    code = shlex.split(check)[2]
    assert f'm.version("ray") == "{ray.__version__}"' in code
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    other = code.replace(ray.__version__, "0.0.1")
    assert subprocess.run([sys.executable, "-c", other], capture_output=True).returncode != 0
    without_project = code.replace("dml-study", "dml-study-not-installed")
    assert subprocess.run([sys.executable, "-c", without_project], capture_output=True).returncode != 0


def test_on_premise_settings_to_change_are_marked(local):
    provider = local["provider"]
    assert "CHANGE-ME" in provider["head_ip"] and all("CHANGE-ME" in ip for ip in provider["worker_ips"])
    assert local["auth"]["ssh_user"] == "CHANGE-ME"
    found = re.findall(r"DML_STORAGE=\"?([^\"'\s]+)", " ".join(local["setup_commands"]))
    assert len(found) == 1 and "CHANGE-ME" in found[0]


def test_no_credentials_in_the_on_premise_file(local):
    text = CLUSTER_LOCAL.read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}|PRIVATE KEY", text)
    lowered = text.lower()
    for word in ("aws_secret_access_key", "aws_access_key_id", "password", "token:"):
        assert word not in lowered, word
    # the key is named by its path on the launcher, never included
    assert set(local["auth"]) == {"ssh_user", "ssh_private_key"} and local["auth"]["ssh_private_key"].startswith("~/.ssh/")
