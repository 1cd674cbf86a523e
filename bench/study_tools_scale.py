"""The commands a user runs on a finished study, timed on a large one (issue 27): report, sync, final up to its training,
and the MLflow UI's runs table in a real browser.

Give it a study that bench/study_scale.py kept (``--keep DIR``: each run's ``runs/`` folder is there) or any
study of a runs folder:

  python bench/study_tools_scale.py --runs /tmp/scale_keep/full-32x1000-*/runs --study scale-full-32x1000-...

Each command runs as a user would run it (``DML_RUNS_DIR`` the study's runs folder), one after the other, and is
timed from process start to exit:

* ``python -m study.report --study NAME --out DIR``: every trial's run read from MLflow, the tables, the plots;
* ``python -m study.sync --study NAME``: the spool, Optuna and MLflow reconciled;
* ``python -m study.final --study NAME``, up to the moment it starts training (its line ``final training of ...``):
  the pick read from the records, the config rebuilt; it is then stopped (SIGINT, as a user's Ctrl-C);
* the MLflow UI: ``mlflow server`` on the study's store (loopback, a free port), then headless Chromium
  (tests/browser.py) opens the printed runs-table address: the time until the table shows rows of the study's runs.

One JSON line per command goes to docs/bench/study_tools_scale.jsonl with the study's trial count, the commit,
the load average before and after, and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def env_for(runs: Path) -> dict[str, str]:
    env = {**os.environ, "DML_RUNS_DIR": str(runs), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def timed(command: list[str], env: dict[str, str], until: str | None = None, limit_s: float = 1800) -> dict[str, Any]:
    """Run ``command`` to its end (or until a line of its output contains ``until``, then SIGINT it): wall seconds."""
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reached = None
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip())
        if until and until in line and reached is None:
            reached = time.monotonic() - started
            process.send_signal(signal.SIGINT)
        if time.monotonic() - started > limit_s:
            process.kill()
            break
    returncode = process.wait()
    return {"wall_s": reached if until else time.monotonic() - started, "returncode": returncode, "reached": reached, "tail": lines[-6:]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_ui(runs: Path, study: str, limit_s: float) -> dict[str, Any]:
    import mlflow

    from tests.browser import Browser

    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    parent = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], f"tags.study_name = '{study}' and tags.kind = 'study'"
    )[0]
    experiment_id = parent.info.experiment_id
    port = free_port()
    command = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--backend-store-uri", f"sqlite:///{runs / 'mlflow.db'}", "--workers", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        started = time.monotonic()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() - started > 120 or server.poll() is not None:
                    raise RuntimeError("mlflow server did not come up") from None
                time.sleep(0.5)
        server_up_s = time.monotonic() - started
        url = f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
        # the runs table: the study's parent run as a row (its trials are nested under it) and the count of matching runs
        row = f"document.querySelector('a[href*=\"/runs/{parent.info.run_id}\"]')"
        ready = f"{row} !== null && /[0-9,]+ matching runs/.test(document.body.innerText)"
        with Browser() as browser:
            seconds = browser.time_until(url, ready, timeout_s=limit_s)
            shown = browser.evaluate("(document.body.innerText.match(/([0-9,]+) matching runs/) || [])[1]")
            again = browser.time_until(url, ready, timeout_s=limit_s)  # the page again, the browser's cache warm
            browser.screenshot(str(ROOT / "docs" / "bench" / "study_tools_scale_ui.png"))
        figures = {"wall_s": seconds, "second_load_s": again, "matching_runs_shown": shown, "server_up_s": server_up_s}
        return {**figures, "url": url, "returncode": 0}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/study_tools_scale.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="the study's runs folder (DML_RUNS_DIR)")
    parser.add_argument("--study", required=True, help="the study's name")
    parser.add_argument("--only", nargs="+", choices=("report", "sync", "final", "ui"), default=["report", "sync", "final", "ui"])
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "study_tools_scale.jsonl"))
    args = parser.parse_args(argv)
    runs = Path(args.runs).resolve()
    env = env_for(runs)
    py = sys.executable
    commands = {
        "report": [py, "-m", "study.report", "--study", args.study, "--out", str(runs / "reports" / f"{args.study}-bench")],
        "sync": [py, "-m", "study.sync", "--study", args.study],
        "final": [py, "-m", "study.final", "--study", args.study, "--seeds", "1"],
    }
    import optuna

    from study.search.journal import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = len(optuna.load_study(study_name=args.study, storage=open_storage(f"journal:{runs / 'optuna' / 'journal.log'}")).trials)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for what in args.only:
        load = os.getloadavg()
        if what == "ui":
            row = mlflow_ui(runs, args.study, limit_s=300)
            shown = "mlflow server + chromium on the runs-table address"
        else:
            row = timed(commands[what], env, until="final training of" if what == "final" else None)
            shown = f"DML_RUNS_DIR={runs} python " + shlex.join(commands[what][1:])
        row = {
            "what": what,
            "study": args.study,
            "optuna_trials": trials,
            "command": shown,
            **row,
            "loadavg_before": load,
            "loadavg_after": os.getloadavg(),
            "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{what}: {row['wall_s']} s (rc {row['returncode']}), {trials} trials", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
