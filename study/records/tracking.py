"""MLflow plumbing shared by the study commands: where runs go, what they record.

The default store is local: ``sqlite:///<runs dir>/mlflow.db`` with artifacts
under ``<runs dir>/artifacts`` (``<runs dir>`` is ``$DML_RUNS_DIR`` or
``./runs``). ``--tracking-uri`` or ``$MLFLOW_TRACKING_URI`` point elsewhere,
e.g. at the MLflow server of a cluster's head node.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from study.inputs import UsageError, redacted
from study.records import store

if TYPE_CHECKING:
    import mlflow

RUNS_DIR_ENV = "DML_RUNS_DIR"
DEFAULT_EXPERIMENT = "dml-studies"  # where study.launch records a study, and study.sync and study.final --study look


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
    # MLflow prints "View run ... at: URL" to stdout for every run a server ends: the tracking URI, its password
    # included, once per trial; the commands print where to look themselves
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for name in ("mlflow", "alembic"):  # their INFO lines (database migrations) are not for the user
        logging.getLogger(name).setLevel(logging.WARNING)


# The experiment's kind for MLflow's own readers. MLflow 3.17's UI does not open on it (a toggle kept in the browser
# decides between its GenAI and model-training views): the commands print the runs page's address with
# workflowType=machine_learning instead (console.ui_command).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


# The MLflow UI opens a "shared view" named in its URL (viewStateShareKey=KEY) from the experiment's tag
# mlflow.sharedViewState.KEY, a JSON of the runs table's search and columns; MLflow offers no public API for it, so
# the keys below are those its UI reads (mlflow/server/js, MLflow 3). The runs list's expanded and pinned rows are
# not part of a shared view: a search sorted by a column lists every run flat instead, nothing folded.
SHARED_VIEW_TAG = "mlflow.sharedViewState."
PICKED_TAG = "picked"  # "true" on the pick's trial run


def study_view(study_name: str, metric: str) -> dict[str, Any]:
    """The runs table of one study as the printed URL opens it: the study's runs only, flat, the pick first (sorted
    by its tag ``picked``), the columns that tell them apart (the metric, the loss, the tag), every run in the charts."""
    return {
        "searchFilter": run_filter({"tags.study_name": study_name}),
        "orderByKey": f"tags.`{PICKED_TAG}`",
        "orderByAsc": False,
        "selectedColumns": [f"metrics.`{metric}`", "params.`loss`", f"tags.`{PICKED_TAG}`"],
        "runsHiddenMode": "SHOW_ALL",  # the chart view draws the first 10 runs by default
    }


def share_study_view(client: mlflow.MlflowClient, experiment_id: str, study_name: str, metric: str) -> None:
    """Name ``study_view`` in the experiment's tags under the study's name (``study_view_page`` opens it); written only
    where it differs, so a study ended again (study.sync) writes nothing."""
    key, value = SHARED_VIEW_TAG + study_name, json.dumps(study_view(study_name, metric))
    if client.get_experiment(experiment_id).tags.get(key) != value:
        client.set_experiment_tag(experiment_id, key, value)


def study_view_page(experiment_id: str, study_name: str) -> str:
    """The MLflow UI page (after the server's address) of ``study_view``, in its model-training mode."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={study_name}&workflowType=machine_learning"


def add_tracking_flags(add: Callable[..., Any], experiment_help: str, experiment_default: str | None = DEFAULT_EXPERIMENT) -> None:
    """--tracking-uri and --experiment, the same for every command (``add``: a parser's or group's add_argument)."""
    add("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else a local sqlite store under ./runs)")
    add("--experiment", default=experiment_default, help=experiment_help)


def runs_dir() -> Path:
    return Path(os.environ.get(RUNS_DIR_ENV, "runs")).expanduser().resolve()


def absolute_data_root(flag: str | None) -> str | None:
    """The data root as an absolute path: ``--data-root``, else ``$DML_DATA_ROOT``, else None.

    The rule is ``trainables.core.data.resolve_data_root``'s; absolute here because Tune runs each
    trial in its own working directory.
    """
    from trainables.core.data import (
        resolve_data_root as flag_or_env,  # here, not at the top: it imports torch
    )

    root = flag_or_env(flag)
    return str(root.resolve()) if root else None


def resolve_tracking_uri(flag: str | None) -> str:

    uri = flag or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{runs_dir() / 'mlflow.db'}"


def check_writable(folder: str | os.PathLike, what: str, probe_bytes: int = 0) -> Path:
    """``folder`` (created if missing) must take a new file; returns it resolved. ``what`` names the flag in the error.

    A real write, not ``os.access``: it answers for root, read-only mounts and full disks alike
    (``probe_bytes`` > 0 also checks that much free space).
    """
    folder = Path(folder).expanduser().resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-") as probe:
            probe.write(b"0" * probe_bytes)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        raise UsageError(f"{what}: {folder} is not writable ({error.strerror or error}); expected a writable folder") from None
    return folder


def check_tracking_uri(uri: str) -> None:
    """A store MLflow 3.17 can keep a study in, checked before MLflow touches it (no minutes of retries).

    MLflow's file store (``file://`` or a bare path) is refused by MLflow itself; a sqlite file must lie in
    a writable folder (else MLflow retries its migrations for about two minutes before failing).
    """

    flag = "--tracking-uri" + ("" if uri != os.environ.get("MLFLOW_TRACKING_URI") else " ($MLFLOW_TRACKING_URI)")
    what = f"{flag} {redacted(uri)}"
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if uri.startswith("file:") or not (scheme or uri.startswith("databricks")):
        raise UsageError(
            f"{what}: MLflow's file store is not supported (MLflow 3 refuses it); "
            f"expected sqlite:///PATH/mlflow.db (e.g. sqlite:///{runs_dir() / 'mlflow.db'}) or http(s)://SERVER"
        )
    if scheme == "sqlite":
        path = uri.removeprefix("sqlite:///") if store.is_local_sqlite(uri) else ""
        if not path or path == ":memory:" or path.startswith("file:"):
            raise UsageError(f"{what}: an in-memory or unnamed sqlite store keeps nothing; expected sqlite:///PATH/mlflow.db")
        database = store.sqlite_file(uri)
        check_writable(database.parent, what)
        if database.exists() and (not database.is_file() or not os.access(database, os.R_OK | os.W_OK)):
            raise UsageError(f"{what}: {database} is not a writable file; expected a sqlite database file")


def check_store(uri: str, what: str) -> None:
    """What every command writes, checked in seconds before it starts (a UsageError of one line, else MLflow retries for
    minutes or a traceback comes mid-way): the runs folder (``$DML_RUNS_DIR``: logs, spool, reports, the default store)
    takes a new file, ``uri`` is a store MLflow can keep runs in (``check_tracking_uri``) and its server answers
    (``check_reachable``); a local store that was moved or copied is bound to where it is (``study.relocate``).
    ``what``: the command, named in the runs folder's error."""
    check_writable(runs_dir(), f"{what}: the runs folder (${RUNS_DIR_ENV}, default ./runs)")
    check_tracking_uri(uri)
    check_reachable(uri)
    store.rebind_if_moved(uri)  # a local store moved or copied names its new folder from here on


def experiment_artifacts(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: ``<store folder>/artifacts/<experiment>`` for a local sqlite store, else the server's choice.

    The name becomes a folder, so one that leaves ``artifacts/`` (``../x``, ``/abs``) or names no folder is refused.
    """
    if not experiment.strip() or any(c in experiment for c in "\0\n\r"):
        raise UsageError(f"--experiment {experiment!r}: expected a non-empty name on one line")
    if not store.is_local_sqlite(uri):
        return None
    base = (store.sqlite_file(uri).parent / "artifacts").resolve()
    location = (base / experiment).resolve()
    if location == base or base not in location.parents:
        raise UsageError(
            f"--experiment {experiment!r}: its artifacts folder {location} would lie outside {base}; "
            "expected a name without '..' or a leading '/'"
        )
    return location.as_uri()


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """A tracking server must answer its health check within ``timeout`` seconds (refused: at once).

    A ``user:password@`` in ``uri`` is sent as HTTP basic auth, as MLflow's client sends it (urllib would take it
    for part of the host name), and is shown redacted in the error.
    """
    if not uri.startswith(("http://", "https://")):
        return
    import base64
    import http.client
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(uri)
    request = urllib.request.Request(parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl().rstrip("/") + "/health")
    if parts.username is not None:
        credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode("ascii"))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if response.status == 200:
                return
            reason: object = f"HTTP {response.status}"
    except http.client.HTTPException as error:  # something else than an HTTP server answered (another service's port)
        reason = f"not an HTTP reply: {type(error).__name__}"
    except OSError as error:  # refused, timed out, unknown host (urllib's URLError is an OSError)
        reason = getattr(error, "reason", None) or error
    raise UsageError(f"--tracking-uri {redacted(uri)}: MLflow server unreachable ({reason}); start it or point --tracking-uri elsewhere")


def setup(uri: str, experiment: str) -> str:
    """Point MLflow at ``uri`` and make sure ``experiment`` exists, tagged EXPERIMENT_KIND; returns its id."""
    import mlflow

    configure_mlflow()
    check_tracking_uri(uri)  # also creates a local store's folder
    location = experiment_artifacts(uri, experiment)
    mlflow.set_tracking_uri(uri)
    key, value = EXPERIMENT_KIND
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
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


def installed_version(*distributions: str) -> str:
    """The version of the first of ``distributions`` that is installed (pip's view), without importing it."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def reproducibility_tags() -> dict[str, str]:
    """What makes a run reproducible besides its config: code version and library versions (as installed: a driver
    that tags its runs need not import torch)."""
    import mlflow

    return {
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": installed_version("torch"),
        "torchvision": installed_version("torchvision"),
        "faiss": installed_version("faiss-cpu", "faiss-gpu", "faiss"),
        "mlflow": mlflow.__version__,
        "host": platform.node(),
        "command": redacted(" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))[:500],
    }


def fail_orphans(client: mlflow.MlflowClient, run_ids: list[str], reason: str, status: str = "FAILED") -> None:
    """Mark runs that are still RUNNING as ``status`` (FAILED, or KILLED when stopped) with ``reason`` (nothing is left RUNNING)."""
    import mlflow

    for run_id in run_ids:
        try:
            run = client.get_run(run_id)
        except mlflow.exceptions.MlflowException:
            continue
        if run.info.status == "RUNNING":
            client.set_tag(run_id, "failure_reason", reason[:5000])
            client.set_terminated(run_id, status=status)


# ----------------------------------------------------------------------------- studies
def run_filter(equal: Mapping[str, str]) -> str:
    """The MLflow search filter of runs whose ``{key: value}`` all hold (``tags.kind = 'study' and ...``): every filter
    the commands send is built here.

    MLflow's grammar quotes a value in single (or double) quotes and has no escape inside them, so a value holding a
    quote, a backslash or a line break is refused instead of quoted: it could end its quote and add clauses. The names
    users give are checked by the name rule (``study.names``) before this; run ids are hex.
    """
    for value in equal.values():
        if any(c in value for c in "'\"\\\n\r"):
            raise UsageError(f"{value!r}: a quote, backslash or line break cannot be searched for in MLflow; expected a name or run id")
    return " and ".join(f"{key} = '{value}'" for key, value in equal.items())


SEARCH_PAGE = 1000  # runs (experiments) per search call: MLflow's default page, which a server answers in one reply


def all_pages(search: Callable[..., Any], **query: Any) -> list:
    """Everything an MLflow search (``client.search_runs``, ``client.search_experiments``) finds for ``query``, read page
    after page: one call returns at most a page and a token for the rest, so a single call with a ``max_results`` drops
    what lies beyond it (issue 27)."""
    found, token = [], None
    while True:
        page = search(**query, max_results=SEARCH_PAGE, page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            return found


def find_study_run(client: mlflow.MlflowClient, experiment_id: str, study_name: str):
    """The parent run of ``study_name`` in the experiment, or None."""
    runs = client.search_runs(
        [experiment_id], filter_string=run_filter({"tags.study_name": study_name, "tags.kind": "study"}), max_results=5
    )
    return runs[0] if runs else None


def child_runs(client: mlflow.MlflowClient, experiment_id: str, parent_id: str, kind: str = "trial") -> list:
    """Every child run of ``parent_id`` tagged ``kind``."""
    children = run_filter({"tags.mlflow.parentRunId": parent_id, "tags.kind": kind})
    return all_pages(client.search_runs, experiment_ids=[experiment_id], filter_string=children)


def metric_histories(client: mlflow.MlflowClient, run_ids: list[str], keys: list[str]) -> dict[tuple[str, str], list]:
    """``client.get_metric_history(run, key)`` for every run and key: {(run id, key): [Metric, ...]} ([] when none).

    MLflow's client reads one run's key per call, each through its ORM: minutes for the curves of a study of thousands
    of trials (docs/performance.md, measurements behind the code). A local sqlite store is therefore read in one query
    per 500 runs, from the ``metrics`` table MLflow's schema defines (``value`` read as NaN where ``is_nan`` is set, as
    MLflow reads it); any other store through the client, run by run.
    """

    from mlflow.entities import Metric

    out: dict[tuple[str, str], list] = {(run_id, key): [] for run_id in run_ids for key in keys}
    uri = str(client.tracking_uri)
    if not store.is_local_sqlite(uri) or not store.sqlite_file(uri).is_file():
        for run_id, key in out:
            out[run_id, key] = client.get_metric_history(run_id, key)
        return out
    with store.read_sqlite(store.sqlite_file(uri)) as db:
        for start in range(0, len(run_ids), 500):
            runs = run_ids[start : start + 500]
            query = (
                f"SELECT run_uuid, key, value, timestamp, step, is_nan FROM metrics WHERE run_uuid IN ({','.join('?' * len(runs))}) "
                f"AND key IN ({','.join('?' * len(keys))})"
            )
            for run_id, key, value, timestamp, step, is_nan in db.execute(query, (*runs, *keys)):
                out[run_id, key].append(Metric(key, float("nan") if is_nan else value, timestamp, step))
    return out


def fail_study(uri: str, parent_run_id: str) -> list[tuple[str, int]]:
    """A study none of whose trials completed: its parent run ends FAILED with ``failure_reason`` "no trial completed
    (N failed, M stopped early)", and the distinct reasons its trial runs failed with are returned, each once with how
    many trials it hit, the most frequent first."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    trials = child_runs(client, client.get_run(parent_run_id).info.experiment_id, parent_run_id)
    failed = [run for run in trials if run.info.status == "FAILED"]
    reasons = Counter(run.data.tags.get("failure_reason", "no reason recorded") for run in failed)
    stopped = f", {len(trials) - len(failed)} stopped early" if len(trials) > len(failed) else ""
    client.set_tag(parent_run_id, "failure_reason", f"no trial completed ({len(failed)} failed{stopped})")
    client.set_terminated(parent_run_id, status="FAILED")
    return reasons.most_common()


def first_error_line(text: str | None) -> str:
    """The most telling line of a traceback: its last non-empty line, URL passwords redacted (MLflow's errors name the
    URL they requested, user and password included). A database error of SQLAlchemy (MLflow's stores) ends with the
    statement, its parameters and a link (``[SQL: ...]`` and on); its line is the one before them ("database or
    disk is full")."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    statement = next((i for i, line in enumerate(lines) if line.startswith("[SQL: ")), None)
    if statement:
        lines = lines[:statement]
    return redacted(lines[-1])[:1000] if lines else "unknown error"
