"""`ray up cluster.local.yaml` on three separate hosts on this machine, studies on it, a worker lost mid-trial.

The module brings the cluster up once (a module fixture), runs a rehearsal study with its checkpoints in a folder
every host sees, then two studies that each lose the worker of a running trial: its link cut at the bridge
(checkpoints on S3), then every process of the host SIGKILLed (checkpoints in the shared folder). Each time the
trial continues from its last checkpoint on the other worker, every trial is recorded once, and the worker, back,
is restarted by the head's autoscaler. Last, `ray down` and README's `ray stop` on the workers.

The hosts (tests/hosts.py) are network namespaces on a private bridge, each with its own address in 10.28.0.0/24,
its own sshd (a key made for the test), /tmp, home, hostname and process tree: a head and two workers, plus the
launcher, the user's machine, where `ray up` runs and an S3 stand-in (moto's server) listens. The shipped
cluster.local.yaml is copied with the test's addresses, user and key filled in, DML_STORAGE set to an s3:// URI on
the stand-in and its AWS_ENDPOINT_URL exported beside it (as README says for a store of your own); nothing else
changes: Ray's on-premise provider runs the file's setup and start commands over ssh, the head's autoscaler starts
the workers, MLflow runs on the head's loopback.

What the hosts share with this machine is the filesystem: every host sees the checkout and its .venv at the same
paths, wherever they are (tests/hosts.py binds a checkout under /tmp or /root into each host's own). Each host's
~/venv is a link to that .venv (a machine that comes with the environment), so the setup commands' install step
finds this project and the pinned Ray there and runs no pip (the hosts reach no index).
The shared folder of the studies' checkpoints is a folder of this machine, as an NFS mount would be on real hosts.

Known differences from real hosts:
- A partitioned worker still reaches the shared folder (the filesystem is not cut with the link), which NFS would
  not; the partition test therefore keeps its checkpoints on the S3 stand-in, which the cut worker cannot reach.
- Ray's autoscaler v2 (the default of `ray up` since Ray 2.50) starts only one of the two workers of this provider
  (it counts the head, of the same node type, as a worker and then waits for it forever: "cloud instance ... no
  longer found"), so `ray up` runs with RAY_UP_enable_autoscaler_v2=0, the autoscaler v1, as README tells users to.
- `ray down` with this provider runs `ray stop` on the head only. A worker's raylet exits by itself once it has
  lost the head's GCS (Ray's reconnect timeout, 60 s); its log monitor stays. README has users run `ray stop` on
  each worker, and the last test does so.
- Ray's own servers (GCS, raylet, object manager, agents) listen on every address of a host (Ray 2.60 has no
  setting to bind them to one); on these hosts that is the loopback and the host's own address only.

Needs root, iproute2, util-linux's unshare, rsync and Debian's openssh-server (.ci/run installs them); skipped
without them.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import assert_epochs_recorded, wait_for
from tests.hosts import Host, Hosts, missing_tools, unshareable

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_LOCAL = ROOT / "cluster.local.yaml"
VENV = Path(sys.prefix)
RAY = VENV / "bin" / "ray"
BUCKET = "dml-study-test"
S3_PORT = 9000
# the autoscaler v1: v2 starts one worker of the two with this provider (module docstring)
LAUNCHER_ENV = {"RAY_UP_enable_autoscaler_v2": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# the stand-in's keys, written to each host's ~/.aws/credentials (moto takes any)
S3_KEYS = {"aws_access_key_id": "moto", "aws_secret_access_key": "moto"}

MISSING = missing_tools() + ([] if (VENV / "bin" / "moto_server").exists() else ["moto[server] (the dev extras)"])

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"separate hosts need {', '.join(MISSING)}"),
    pytest.mark.skipif(unshareable() is not None, reason=f"the hosts cannot see this checkout: {unshareable()}"),
]

# GCS queries from the head's network namespace: every node Ray knows, once the condition ``want`` holds or the
# time is up. ``want``: {"alive": [ip, ...]} (exactly these alive), {"dead": [ip, after_ms]} (a node of ip declared
# dead after that time), or {} (at once). The GCS client needs no Ray node of its own, unlike a driver.
NODES = """
import json, sys
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo
address, want, timeout, root = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
sys.path.insert(0, root)
from tests.conftest import wait_for
client = GcsClient(address=address)

def holds(nodes):
    alive = sorted(n["ip"] for n in nodes if n["state"] == "ALIVE")
    if "alive" in want and alive != sorted(want["alive"]):
        return False
    if "dead" in want:
        ip, after = want["dead"]
        return any(n["ip"] == ip and n["state"] == "DEAD" and n["end_ms"] > after for n in nodes)
    return True

def query():
    return [
        {"ip": n.node_manager_address, "state": GcsNodeInfo.GcsNodeState.Name(n.state), "head": n.is_head_node,
         "resources": dict(n.resources_total), "end_ms": n.end_time_ms, "death": n.death_info.reason_message}
        for n in client.get_all_node_info(timeout=10).values()
    ]

try:
    wait_for(lambda: holds(query()), timeout, "the nodes", every_s=0.5)
except AssertionError:
    pass  # the time is up: the caller reads the nodes as they are
nodes = query()
print(json.dumps(nodes))
"""


@dataclass
class Cluster:
    hosts: Hosts
    config: Path
    shared: Path
    storage: str  # DML_STORAGE
    endpoint: str
    seconds: dict[str, float] = field(default_factory=dict)
    down: bool = False

    @property
    def head(self):
        return self.hosts["head"]

    @property
    def workers(self):
        return [self.hosts["worker1"], self.hosts["worker2"]]

    def ray(self, *argv: str, timeout: float) -> subprocess.CompletedProcess:
        """The `ray` CLI on the launcher, from the repository root (file_mounts syncs "." from there)."""
        env = {**os.environ, **LAUNCHER_ENV}
        return self.hosts.on_launcher([str(RAY), *argv], timeout=timeout, cwd=ROOT, env=env, check=False)

    def exec(self, command: str, timeout: float) -> subprocess.CompletedProcess:
        return self.ray("exec", str(self.config), command, timeout=timeout)

    def nodes(self, want: dict | None = None, timeout: float = 0) -> list[dict]:
        code = [str(VENV / "bin" / "python"), "-c", NODES, f"{self.head.ip}:6379", json.dumps(want or {}), str(timeout), str(ROOT)]
        return json.loads(self.hosts.in_netns(self.head, code, timeout=timeout + 60).stdout)

    def alive(self, nodes: list[dict]) -> list[str]:
        return sorted(n["ip"] for n in nodes if n["state"] == "ALIVE")

    @property
    def mlflow_db(self) -> Path:
        return self.head.home / "mlflow" / "mlflow.db"

    @property
    def journal(self) -> Path:
        return self.head.home / "dml" / "runs" / "optuna" / "journal.log"


def write_config(hosts: Hosts, storage: str, endpoint: str) -> Path:
    """cluster.local.yaml with the test's addresses, user, key and store: what a user fills in."""
    config = yaml.safe_load(CLUSTER_LOCAL.read_text())
    config["cluster_name"] = hosts.tag
    config["provider"]["head_ip"] = hosts["head"].ip
    config["provider"]["worker_ips"] = [hosts["worker1"].ip, hosts["worker2"].ip]
    config["auth"] = {"ssh_user": "root", "ssh_private_key": str(hosts.key)}
    placeholder = "'export DML_STORAGE=\"/CHANGE-ME/shared/dml-study\"'"
    assert placeholder in config["setup_commands"][0]
    filled = f"'export DML_STORAGE=\"{storage}\"' 'export AWS_ENDPOINT_URL=\"{endpoint}\"'"
    config["setup_commands"][0] = config["setup_commands"][0].replace(placeholder, filled)
    path = hosts.base / "cluster.local.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def provision(hosts: Hosts) -> None:
    """What the machines come with: the environment at ~/venv and the S3 store's keys."""
    for host in hosts.servers:
        (host.home / "venv").symlink_to(VENV)
        (host.home / ".aws").mkdir()
        (host.home / ".aws" / "credentials").write_text("[default]\n" + "".join(f"{k} = {v}\n" for k, v in S3_KEYS.items()))
        (host.home / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")


def start_s3(hosts: Hosts) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on the launcher's address, with the test's bucket."""
    launcher = hosts.launcher
    argv = ["ip", "netns", "exec", launcher.netns, str(VENV / "bin" / "moto_server"), "-H", launcher.ip, "-p", str(S3_PORT)]
    log = open(launcher.root / "moto.log", "w")  # noqa: SIM115 (kept open for the server's life)
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    endpoint = f"http://{launcher.ip}:{S3_PORT}"
    # curl retries the refused connection until the server listens (bounded); moto takes unsigned requests
    hosts.on_launcher(
        ["curl", "-sf", "--retry", "60", "--retry-connrefused", "--retry-delay", "1", "-X", "PUT", f"{endpoint}/{BUCKET}"], timeout=90
    )
    return server, endpoint


def s3_keys(hosts: Hosts, endpoint: str, prefix: str) -> list[str]:
    out = hosts.on_launcher(["curl", "-sf", f"{endpoint}/{BUCKET}?list-type=2&prefix={prefix}&max-keys=10000"], timeout=30).stdout
    return re.findall(r"<Key>([^<]+)</Key>", out)


@pytest.fixture(scope="module")
def cluster():
    """The hosts, the S3 stand-in and `ray up` of the filled-in cluster.local.yaml, until every node is alive and
    MLflow answers on the head; `ray down` (unless a test ran it) and the hosts removed after the module."""
    started = time.monotonic()
    seconds: dict[str, float] = {}
    with Hosts(["head", "worker1", "worker2"]) as hosts:
        server, endpoint = start_s3(hosts)
        try:
            provision(hosts)
            shared = hosts.base / "shared"
            shared.mkdir()
            storage = f"s3://{BUCKET}/dml-study"
            c = Cluster(hosts, write_config(hosts, storage, endpoint), shared, storage, endpoint, seconds)
            seconds["hosts and S3"] = time.monotonic() - started
            t = time.monotonic()
            up = c.ray("up", "-y", "--no-config-cache", str(c.config), timeout=400)
            seconds["ray up"] = time.monotonic() - t
            assert up.returncode == 0, (up.stdout + up.stderr)[-6000:]
            nodes = c.nodes(want={"alive": [h.ip for h in (c.head, *c.workers)]}, timeout=240)
            assert len(c.alive(nodes)) == 3, nodes
            seconds["ray up to both workers alive"] = time.monotonic() - t
            health = hosts.ssh(c.head, "curl -sf --retry 60 --retry-connrefused --retry-delay 1 http://127.0.0.1:5000/health", timeout=90)
            assert health.stdout.strip() == "OK", health
            seconds["ray up to MLflow answering"] = time.monotonic() - t
            yield c
            if not c.down:
                c.ray("down", "-y", str(c.config), timeout=200)
        finally:
            server.kill()
            server.wait(timeout=30)
            print(f"\ncluster timings (s): { {k: round(v, 1) for k, v in seconds.items()} }")


# -- records --------------------------------------------------------------------------------------------------------


def trial_records(c: Cluster, study: str) -> dict[str, dict]:
    """Each trial run of ``study`` in the head's MLflow store: status, tags and its train_loss steps with times."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{c.mlflow_db}")
    experiment = client.get_experiment_by_name("dml-studies")
    found = client.search_runs([experiment.experiment_id], filter_string=f"tags.study_name = '{study}'", max_results=1000)
    records = {}
    for run in found:
        history = client.get_metric_history(run.info.run_id, "train_loss")
        records[run.info.run_id] = {
            "kind": run.data.tags.get("kind"),
            "status": run.info.status,
            "tags": run.data.tags,
            "steps": [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))],
            "times": {m.step: m.timestamp / 1000 for m in history},
        }
    return records


def epochs_now(c: Cluster, study: str) -> list[tuple[str, str | None, int]]:
    """(run id, node_ip tag, last epoch) of the trial runs of ``study``: a cheap read-only query, polled mid-study."""
    if not c.mlflow_db.exists():
        return []
    query = """
        select r.run_uuid,
               (select value from tags t where t.run_uuid = r.run_uuid and t.key = 'node_ip'),
               (select max(step) from metrics m where m.run_uuid = r.run_uuid and m.key = 'train_loss')
        from runs r
        join tags s on s.run_uuid = r.run_uuid and s.key = 'study_name' and s.value = ?
        join tags k on k.run_uuid = r.run_uuid and k.key = 'kind' and k.value = 'trial'"""
    with sqlite3.connect(f"file:{c.mlflow_db}?mode=ro", uri=True, timeout=10) as con:
        return [(run, ip, int(step or 0)) for run, ip, step in con.execute(query, (study,)).fetchall()]


def assert_recorded_once(c: Cluster, study: str, trials: int) -> dict[str, dict]:
    """The parent run FINISHED; one FINISHED MLflow run per Optuna trial, each with every epoch it trained once, in
    order; every Optuna trial COMPLETE or PRUNED (stopped early by the scheduler)."""
    import optuna

    from study.search.journal import open_storage

    records = trial_records(c, study)
    assert [r["status"] for r in records.values() if r["kind"] == "study"] == ["FINISHED"]
    runs = {run_id: r for run_id, r in records.items() if r["kind"] == "trial"}
    found = optuna.load_study(study_name=study, storage=open_storage(f"journal:{c.journal}"))
    assert len(found.trials) == len(runs) == trials
    by_number = {t.number: t for t in found.trials}
    assert sorted(int(r["tags"]["optuna_trial_number"]) for r in runs.values()) == sorted(by_number)
    for run in runs.values():
        trial = by_number[int(run["tags"]["optuna_trial_number"])]
        assert trial.state.name in ("COMPLETE", "PRUNED") and run["status"] == "FINISHED", (trial.state, run)
        assert_epochs_recorded(run["steps"], trial.user_attrs, run["tags"])
    return runs


def launch_command(study: str, storage: str, *flags: str) -> str:
    """study.launch on the head, as README runs it: `ray exec CLUSTER 'cd ~/dml && python -m study.launch ...'`."""
    argv = ["python", "-m", "study.launch", "--address", "auto", "--tracking-uri", "http://127.0.0.1:5000"]
    argv += ["--storage-path", storage, "--study-name", study, "--confirm-budget", "0", *flags]
    # $DML_STORAGE stays for the head's shell, as in README's command
    return "cd ~/dml && " + " ".join(a if a.startswith("$DML_STORAGE") else shlex.quote(a) for a in argv)


# -- the tests ------------------------------------------------------------------------------------------------------


def test_ray_up_starts_a_head_without_cpus_and_both_workers(cluster):
    nodes = cluster.nodes()
    alive = {n["ip"]: n for n in nodes if n["state"] == "ALIVE"}
    assert sorted(alive) == sorted(h.ip for h in (cluster.head, *cluster.workers))
    head = alive[cluster.head.ip]
    assert head["head"] and head["resources"].get("CPU", 0) == 0  # --num-cpus=0: no trial runs on the head
    for worker in cluster.workers:
        assert alive[worker.ip]["resources"]["CPU"] >= 1
    # each host got the repository from the launcher and runs the cluster's environment file
    for host in (cluster.head, *cluster.workers):
        out = cluster.hosts.ssh(host, "hostname; test -f ~/dml/study/launch/cli.py && echo synced; grep DML_STORAGE ~/.dml_env").stdout
        assert out.split()[:2] == [host.name, "synced"] and cluster.storage in out


def test_nothing_listens_beyond_its_host(cluster):
    """MLflow and the dashboard on the head's loopback only; sshd on the host's address; Ray's own servers on the
    host's address or its wildcard, which in a namespace holding only lo and eth0 is those two addresses."""
    for host in (cluster.head, *cluster.workers, cluster.hosts.launcher):
        addresses = cluster.hosts.in_netns(host, ["ip", "-o", "-4", "addr", "show"]).stdout
        assert sorted(line.split()[3] for line in addresses.splitlines()) == sorted(["127.0.0.1/8", f"{host.ip}/24"])
        listening = cluster.hosts.listening(host)
        for address, port, process in listening:
            assert address in ("127.0.0.1", host.ip, "*", "0.0.0.0"), (host.name, address, port, process)
            if port in (5000, 8265):  # MLflow, Ray's dashboard
                assert address == "127.0.0.1", (host.name, address, port, process)
            if process == "sshd":
                assert address == host.ip
    head_ports = {port for _, port, _ in cluster.hosts.listening(cluster.head)}
    assert {22, 5000, 6379} <= head_ports
    # from another host the head's MLflow port is closed
    refused = cluster.hosts.on_launcher(["curl", "-s", "--max-time", "5", f"http://{cluster.head.ip}:5000/health"], timeout=30, check=False)
    assert refused.returncode == 7, refused  # curl: failed to connect
    assert [(a, p) for a, p, _ in cluster.hosts.listening(cluster.hosts.launcher)] == [(cluster.hosts.launcher.ip, S3_PORT)]


def test_a_study_keeps_its_checkpoints_in_the_shared_folder(cluster):
    """README's study command with --storage-path on the folder every host sees: trials on the workers write their
    checkpoints there, the driver on the head its experiment state, MLflow on the head holds one run per trial."""
    storage = cluster.shared / "ray"
    t = time.monotonic()
    flags = ["--rehearse", "0.2", "--space", "smoke", "--num-samples", "4", "--epochs", "4", "--checkpoint-every", "0"]
    out = cluster.exec(launch_command("shared", str(storage), *flags), timeout=300)
    cluster.seconds["study, shared folder"] = time.monotonic() - t
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert "study shared finished" in out.stdout
    runs = assert_recorded_once(cluster, "shared", 4)
    assert {r["tags"]["node_ip"] for r in runs.values()} <= {w.ip for w in cluster.workers}
    checkpoints = sorted((storage / "shared").glob("*/checkpoint_*"))
    assert len({path.parent for path in checkpoints}) == 4, checkpoints
    assert list((storage / "shared").glob("experiment_state-*.json"))
    # the study's artifacts went through the head's MLflow server to $DML_STORAGE/mlflow on the S3 store
    assert any(key.endswith("/best_config.yaml") for key in s3_keys(cluster.hosts, cluster.endpoint, "dml-study/mlflow/"))


@dataclass
class Fault:
    """A study run with a fault on the worker of its first trial to reach epoch 2, and the repair once that trial
    reports from another worker."""

    out: subprocess.CompletedProcess
    victim: Host
    seen: dict[str, tuple[str, int]]  # run id -> (node_ip, last epoch) when the fault struck
    struck_at: float  # wall clock
    repaired_at: float
    wall: float


def study_with_a_fault(c: Cluster, study: str, storage: str, fault, repair) -> Fault:
    flags = ["--rehearse", "1", "--space", "smoke", "--num-samples", "2", "--epochs", "6", "--scheduler", "fifo", "--checkpoint-every", "0"]
    command = launch_command(study, storage, *flags, "--max-concurrent", "2")
    victim = struck_at = repaired_at = None
    seen: dict[str, tuple[str, int]] = {}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        t = time.monotonic()
        future = pool.submit(c.exec, command, 400)
        try:

            def step() -> bool:
                """One look at the trials' epochs: strike a worker once a trial reached epoch 2 on it, repair it once a
                trial of it reports from the other worker; True when the study is over."""
                nonlocal victim, struck_at, seen, repaired_at
                rows = epochs_now(c, study)
                if victim is None and any(epoch >= 2 for _, _, epoch in rows):
                    ip = next(ip for _, ip, epoch in rows if epoch >= 2)
                    victim = next(w for w in c.workers if w.ip == ip)
                    fault(victim)
                    struck_at = time.time()
                    seen = {run: (ip, epoch) for run, ip, epoch in rows}
                elif victim is not None and repaired_at is None:
                    if any(seen.get(run, (None,))[0] == victim.ip and ip != victim.ip for run, ip, _ in rows):
                        repair(victim)  # mid-study: the trial reports from the other worker
                        repaired_at = time.time()
                return future.done()

            wait_for(step, 300, "the study with a fault to end")
        finally:
            if victim is not None and repaired_at is None:
                repair(victim)
        out = future.result(timeout=400)
    assert victim is not None, "no trial reached epoch 2 while the study ran"
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert repaired_at is not None, "no trial moved off the worker"
    return Fault(out, victim, seen, struck_at, repaired_at, time.monotonic() - t)


def assert_moved_and_recovered(c: Cluster, study: str, fault: Fault, label: str) -> None:
    """Both trials recorded once; the trial of the lost worker continued from its last checkpoint on the other one;
    Ray declared the node dead; the worker, back, runs Ray again (restarted by the head's autoscaler)."""
    runs = assert_recorded_once(c, study, 2)
    moved = {run_id: r for run_id, r in runs.items() if int(r["tags"].get("resumed_from_epoch", 0)) > 0}
    assert moved and all(fault.seen[run_id][0] == fault.victim.ip for run_id in moved), (moved, fault.seen)
    for run_id, run in moved.items():
        assert run["tags"]["node_ip"] != fault.victim.ip
        # from its last checkpoint: at most the epoch in flight when the worker was lost is trained again
        resumed = int(run["tags"]["resumed_from_epoch"])
        assert resumed >= fault.seen[run_id][1] - 1, (run["tags"], fault.seen[run_id])
        c.seconds[f"{label}: to the trial's next epoch on the other worker"] = run["times"][resumed + 1] - fault.struck_at
    nodes = c.nodes(want={"dead": [fault.victim.ip, fault.struck_at * 1000]}, timeout=180)
    dead = [
        n["end_ms"] / 1000 for n in nodes if n["ip"] == fault.victim.ip and n["state"] == "DEAD" and n["end_ms"] > fault.struck_at * 1000
    ]
    assert dead, f"Ray did not declare the lost worker's node dead: {nodes}"
    c.seconds[f"{label}: to the node declared dead"] = max(dead) - fault.struck_at
    everyone = [h.ip for h in (c.head, *c.workers)]
    assert c.alive(c.nodes(want={"alive": everyone}, timeout=180)) == sorted(everyone)
    c.seconds[f"{label}: worker back to Ray alive on it"] = time.time() - fault.repaired_at


def test_a_worker_cut_off_mid_trial_loses_nothing(cluster):
    """Checkpoints on the S3 store ($DML_STORAGE/ray, cluster.yaml's path). Once a trial has 2 epochs, its worker's
    link goes down at the bridge (its processes go on): Ray declares the node dead, the trial continues from its
    last checkpoint, read from S3, on the other worker; the link comes back mid-study, and the worker's stale raylet
    is told it is dead and exits."""
    hosts = cluster.hosts
    fault = study_with_a_fault(cluster, "cut", "$DML_STORAGE/ray", hosts.partition, hosts.heal)
    cluster.seconds["study, S3, a worker cut off"] = fault.wall
    assert_moved_and_recovered(cluster, "cut", fault, "cut")
    keys = s3_keys(hosts, cluster.endpoint, "dml-study/ray/cut/")
    assert len({k.split("/")[3] for k in keys if "/checkpoint_" in k}) == 2, keys
    assert any(k.split("/")[-1].startswith("experiment_state-") for k in keys), keys


def test_a_worker_whose_processes_are_all_killed_loses_nothing(cluster):
    """Checkpoints in the shared folder. Once a trial has 2 epochs, every process of its worker host is SIGKILLed
    (a crash); its sshd comes back once the trial reports from the other worker (a reboot)."""
    hosts = cluster.hosts
    fault = study_with_a_fault(cluster, "killed", str(cluster.shared / "ray"), hosts.crash, hosts.boot)
    cluster.seconds["study, shared folder, a worker killed"] = fault.wall
    assert_moved_and_recovered(cluster, "killed", fault, "killed")


def test_ray_down_and_readmes_worker_stop_leave_no_ray_running(cluster):
    """`ray down` runs `ray stop` on the head only (this provider stops no worker); MLflow stays up there, as with
    cluster.yaml (its store is the head's). The workers' raylets would exit a minute later, having lost the head,
    and their log monitors never: README's `ray stop` over ssh on each worker ends them at once."""
    t = time.monotonic()
    out = cluster.ray("down", "-y", str(cluster.config), timeout=200)
    cluster.down = True
    cluster.seconds["ray down"] = time.monotonic() - t
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert not ray_processes(cluster, cluster.head)
    assert cluster.hosts.ssh(cluster.head, "curl -sf http://127.0.0.1:5000/health").stdout.strip() == "OK"
    left = {w.name: ray_processes(cluster, w) for w in cluster.workers}
    assert all("raylet" in names for names in left.values()), left
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        stops = list(pool.map(lambda w: cluster.hosts.ssh(w, "source ~/.dml_env && ray stop", timeout=120), cluster.workers))
    assert all(stop.returncode == 0 for stop in stops)
    assert {w.name: ray_processes(cluster, w) for w in cluster.workers} == {w.name: [] for w in cluster.workers}


def ray_processes(c: Cluster, host) -> list[str]:
    """Ray's processes on ``host`` (raylet, GCS, Ray workers and agents)."""
    found = []
    for pid in c.hosts.pids(host):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if name in ("raylet", "gcs_server") or name.startswith("ray::") or "/ray/" in cmdline:
            found.append(cmdline[:160] if name.startswith("python") else name)
    return found
