"""The local Ray of a single-machine study: loopback only, trials at normal priority, no idle workers started ahead, and no Ray
imported before it starts."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

PROBE = textwrap.dedent(
    """
    import ipaddress, json, os, sys
    from pathlib import Path
    import study.launch.run
    from study.ray_session import ray_session
    assert "ray" not in sys.modules, "importing study.launch imported Ray"

    def tree(root):
        parents = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found, todo = [], [root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += parents.get(pid, [])
        return found

    def socket_inodes(pids):
        inodes = set()
        for pid in pids:
            for fd in Path(f"/proc/{pid}/fd").glob("*"):
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        return inodes

    def listening(inodes):
        found = set()
        for table, size in (("tcp", 4), ("tcp6", 16)):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    raw = bytes.fromhex(fields[1].split(":")[0])
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))  # /proc prints 32-bit words in host order
                    ip = ipaddress.ip_address(words)
                    found.add(str(getattr(ip, "ipv4_mapped", None) or ip))
        return found

    def command_line(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:  # ended since the tree was read
            return ""

    def is_worker(line):  # a starting worker runs default_worker.py, a started one names itself ray::IDLE, ray::<task>, ...
        argv = line.split(chr(0))
        return (len(argv) > 1 and argv[1].endswith("default_worker.py")) or (argv[0].startswith("ray::") and "Agent" not in argv[0])

    with ray_session(None):
        import ray

        @ray.remote(num_cpus=1)
        class Trial:  # as Tune's trial actors
            def niceness(self):
                return os.nice(0), os.environ.get("PYTHONWARNINGS"), dict(ray.get_runtime_context().runtime_env)

        nice, warnings, runtime_env = ray.get(Trial.remote().niceness.remote())
        pids = tree(os.getpid())
        addresses = listening(socket_inodes(pids))
        workers = [pid for pid in pids if is_worker(command_line(pid))]
    print(json.dumps({"listening": sorted(addresses), "worker_niceness": nice, "driver_niceness": os.nice(0), "workers": len(workers),
                      "worker_warnings": warnings, "runtime_env": runtime_env}))
    """
)


def probe(**env: str) -> dict:
    """What PROBE finds about a fresh local Ray started as study.launch starts it, with ``env`` added."""
    user = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}  # as a user who set none
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=600, env={**user, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_local_ray_listens_on_loopback_only_runs_workers_at_normal_priority_and_prestarts_none():
    found = probe()
    assert found["listening"], "no listening socket of the local Ray was found"
    assert all(ipaddress.ip_address(a).is_loopback for a in found["listening"]), found["listening"]
    assert found["worker_niceness"] == found["driver_niceness"]  # Ray's default adds 15
    # no idle workers started ahead: Ray's default prestarts one per CPU as the driver connects (2 worker processes on
    # 2 CPUs after the one trial-like actor, which took one of them; 1 without).
    # The control is a user's own setting, which wins over LOCAL_RAY_ENV: the same probe with Ray's prestart on.
    assert found["workers"] < probe(RAY_prestart_worker_first_driver="1")["workers"]
    # workers ignore warnings through their inherited environment, not a job runtime_env (whose per-worker setup by
    # Ray's runtime-env agent costs each worker about 0.9 CPU-s more to start)
    assert found["worker_warnings"] == "ignore" and found["runtime_env"] == {}, (found["worker_warnings"], found["runtime_env"])
