"""MLflow plumbing shared by the study commands: where runs go, what they record.

The default store is local: ``sqlite:///<runs dir>/mlflow.db`` with artifacts
under ``<runs dir>/artifacts`` (``<runs dir>`` is ``$DML_RUNS_DIR`` or
``./runs``). ``--tracking-uri`` or ``$MLFLOW_TRACKING_URI`` point elsewhere,
e.g. at the MLflow server of a cluster's head node.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlflow
import yaml

RUNS_DIR_ENV = "DML_RUNS_DIR"


def configure_mlflow() -> None:
    """How the study commands use MLflow; their ``main()`` calls this first (so does ``setup``).

    Settings already in the environment win.
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # Bound how long one MLflow call may block (stock settings retry for minutes); a study keeps
    # records locally while the server is away instead of waiting for it.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    for name in ("mlflow", "alembic"):  # their INFO lines (database migrations) are not for the user
        logging.getLogger(name).setLevel(logging.WARNING)


# Without it MLflow's UI opens an experiment in its GenAI views (traces, evaluation runs); this value opens
# the model-training ones (runs, charts, models).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


class UsageError(ValueError):
    """Bad input from the command line or a file; printed as one line, exit status 2."""


def runs_dir() -> Path:
    return Path(os.environ.get(RUNS_DIR_ENV, "runs")).expanduser().resolve()


def resolve_data_root(flag: str | None) -> str | None:
    """The data root as an absolute path: ``--data-root``, else ``$DML_DATA_ROOT``, else None.

    The rule is ``trainables.core.data.resolve_data_root``'s; absolute here because Tune runs each
    trial in its own working directory.
    """
    from trainables.core.data import resolve_data_root as flag_or_env  # here, not at the top: it imports torch

    root = flag_or_env(flag)
    return str(root.resolve()) if root else None


def resolve_tracking_uri(flag: str | None) -> str:
    uri = flag or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{runs_dir() / 'mlflow.db'}"


def is_local_sqlite(uri: str) -> bool:
    return uri.startswith("sqlite:///")


def ui_command(uri: str) -> str:
    if uri.startswith(("http://", "https://")):
        return f"open {uri} in a browser (or: mlflow ui --backend-store-uri <the server's store>)"
    return f"mlflow ui --backend-store-uri {uri}"


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """A tracking server must answer its health check within ``timeout`` seconds (refused: at once)."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as response:
            if response.status != 200:
                raise OSError(f"HTTP {response.status}")
    except (OSError, urllib.error.URLError) as error:
        reason = getattr(error, "reason", None) or error
        raise UsageError(
            f"--tracking-uri {uri}: MLflow server unreachable ({reason}); start it or point --tracking-uri elsewhere"
        ) from None


def setup(uri: str, experiment: str) -> str:
    """Point MLflow at ``uri`` and make sure ``experiment`` exists, tagged EXPERIMENT_KIND; returns its id."""
    configure_mlflow()
    if is_local_sqlite(uri):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    key, value = EXPERIMENT_KIND
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        location = None
        if is_local_sqlite(uri):
            location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts" / experiment).as_uri()
        return mlflow.create_experiment(experiment, artifact_location=location, tags={key: value})
    if found.tags.get(key) != value:  # an experiment made before the tag, or by another tool
        mlflow.MlflowClient(uri).set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def reproducibility_tags() -> dict[str, str]:
    """What makes a run reproducible besides its config: code version and library versions."""
    import faiss
    import torch
    import torchvision

    return {
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "faiss": getattr(faiss, "__version__", "unknown"),
        "mlflow": mlflow.__version__,
        "host": platform.node(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
    }


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """Parse a YAML file; any problem is a UsageError naming the file."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{file}: file not found; expected {what}")
    try:
        return yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UsageError(f"{file}{where}: YAML syntax error ({problem}); expected {what}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{file}: unreadable ({error}); expected {what}") from None


def write_yaml(path: str | os.PathLike, data: Any) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fail_orphans(client: mlflow.MlflowClient, run_ids: list[str], reason: str) -> None:
    """Mark runs that are still RUNNING as FAILED with ``reason`` (nothing is left RUNNING)."""
    for run_id in run_ids:
        try:
            run = client.get_run(run_id)
        except mlflow.exceptions.MlflowException:
            continue
        if run.info.status == "RUNNING":
            client.set_tag(run_id, "failure_reason", reason[:5000])
            client.set_terminated(run_id, status="FAILED")


# ----------------------------------------------------------------------------- studies
def find_study_run(client: mlflow.MlflowClient, experiment_id: str, study_name: str):
    """The parent run of ``study_name`` in the experiment, or None."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.study_name = '{study_name}' and tags.kind = 'study'", max_results=5)
    return runs[0] if runs else None


def child_runs(client: mlflow.MlflowClient, experiment_id: str, parent_id: str, kind: str = "trial") -> list:
    return client.search_runs(
        [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}' and tags.kind = '{kind}'", max_results=10000
    )


def first_error_line(text: str | None) -> str:
    """The most telling line of a traceback: its last non-empty line."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:1000] if lines else "unknown error"
