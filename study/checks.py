"""Checks of what a study will connect to, made before it does: the Ray cluster, the Optuna storage and the photos.

Each check answers in seconds with a :class:`study.inputs.UsageError` of one line
naming the flag, where the library it guards would retry for minutes (Ray, on an
address with nothing listening) or wait forever (Tune, on trials no node can
hold), or fail with a traceback (SQLAlchemy, on a URL it cannot parse).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from study.inputs import UsageError, redacted
from study.records import tracking
from study.search.journal import journal_file
from trainables.core.cache import attach_cache
from trainables.core.data import DatasetSplits, image_size_for

CONNECT_TIMEOUT_S = 5.0
# The one database port a URL may leave out, by SQLAlchemy dialect; others go unchecked.
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433, "oracle": 1521}


def ray_temp_dir() -> Path:
    """Ray's temp folder, as Ray 2.60 chooses it: $RAY_TMPDIR, else $TMPDIR on Linux, else /tmp; plus ``ray``."""
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / "ray"


def host_port(address: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); anything else is a UsageError starting with ``what``."""
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"{what}: {address!r} is not HOST:PORT; expected HOST:PORT of a Ray cluster (e.g. 10.0.0.5:6379), "
            "'auto' on one of its nodes, or no --address"
        )
    return host, int(port)


def check_listening(host: str, port: int, what: str, advice: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A TCP connect to host:port within ``timeout`` seconds; refused, unresolvable or silent is a UsageError: ``what``, why, ``advice``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except TimeoutError:
        reason = f"no answer within {timeout:.0f} s"
    except OSError as error:
        reason = error.strerror or str(error)
    raise UsageError(f"{what}: nothing answers at {host}:{port} ({reason}); {advice}")


def check_address(address: str | None) -> None:
    """--address names a Ray cluster that is running, checked with a TCP connect to its GCS before ``ray.init``.

    ``ray.init`` on an address where no GCS listens retries for minutes and ignores Ctrl-C meanwhile. ``auto``
    is resolved as Ray resolves it: $RAY_ADDRESS, else the cluster last started on this machine by ``ray start``
    (``<Ray temp dir>/ray_current_cluster``). ``ray://`` (Ray Client) cannot run Tune's driver here.
    """
    flag = "--address"
    if address is None or address == "local":
        return
    if address.startswith("ray://"):
        raise UsageError(
            f"{flag} {address}: Ray Client (ray://) is not supported by this driver; run the launch on the head node "
            "with --address auto (e.g. ray exec cluster.yaml 'cd ~/dml && python -m study.launch --address auto ...')"
        )
    if "://" in address:
        raise UsageError(f"{flag} {address}: expected HOST:PORT of a Ray cluster's GCS or 'auto', without a scheme")
    resolved, source = address, ""
    if address == "auto":
        file = ray_temp_dir() / "ray_current_cluster"
        if os.environ.get("RAY_ADDRESS") not in (None, "", "auto"):
            resolved, source = os.environ["RAY_ADDRESS"], " (from $RAY_ADDRESS)"
        elif file.is_file():
            resolved, source = file.read_text().strip(), f" (the cluster last started here, from {file})"
        else:
            raise UsageError(
                f"{flag} auto: no Ray cluster was started on this machine ({file} is missing); "
                "start one with `ray start --head`, pass --address HOST:PORT, or leave --address out for a local Ray"
            )
        if resolved.startswith("ray://"):
            check_address(resolved)
    what = f"{flag} {address}{source}"
    host, port = host_port(resolved, what)
    check_listening(host, port, what, "expected a running Ray cluster (ray start --head) or no --address")


def ray_connect_failure(address: str, error: BaseException) -> UsageError:
    """The one line for a ``ray.init(address=...)`` that failed after --address passed :func:`check_address`.

    The usual cause is Ray's token authentication: ``ray start`` turns it on (Ray 2.60) and a driver reads the
    cluster's token by itself for ``auto`` only, never for an address given as HOST:PORT. Ray 2.60 reports it as a
    ConnectionError from a RuntimeError whose message holds the AuthenticationError's traceback as text; an
    AuthenticationError in the chain itself counts too.
    """
    import ray.exceptions

    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, ray.exceptions.AuthenticationError) or "AuthenticationError" in str(c) for c in chain):
        return UsageError(
            f"--address {address}: the Ray cluster refused this driver (its token authentication, which `ray start` turns on); "
            "on one of its nodes pass --address auto, which reads the cluster's token, or export RAY_AUTH_MODE=token with "
            "the cluster's token in ~/.ray/auth_token or $RAY_AUTH_TOKEN"
        )
    return UsageError(f"--address {address}: Ray could not connect ({error}); expected a running Ray cluster (ray start --head)")


def check_cluster_resources(cpus_per_trial: float, gpus_per_trial: float) -> None:
    """Some alive node of the running Ray cluster can hold one trial; else Tune would wait forever. Call after ``ray.init``.

    Reads ``ray.nodes()`` (public API). Nodes an autoscaler may add later are not counted: on such a cluster
    keep one node of the trial's type up (cluster.yaml keeps one GPU worker).
    """
    import ray

    alive = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    fits = [r for r in alive if r.get("CPU", 0) >= cpus_per_trial and r.get("GPU", 0) >= gpus_per_trial]
    if fits:
        return
    largest_cpu = max((r.get("CPU", 0) for r in alive), default=0)
    largest_gpu = max((r.get("GPU", 0) for r in alive), default=0)
    raise UsageError(
        f"--cpus-per-trial {cpus_per_trial:g} --gpus-per-trial {gpus_per_trial:g}: no node of the Ray cluster can hold one trial "
        f"({len(alive)} node(s); the largest have {largest_cpu:g} CPUs and {largest_gpu:g} GPUs); "
        "expected per-trial resources that one node offers"
    )


def check_optuna_storage(storage: str) -> str:
    """--optuna-storage: ``journal:PATH`` in a writable folder, or a database URL SQLAlchemy parses, whose driver is
    installed and whose server (if any) answers. Returns the storage string (a journal path made absolute)."""
    flag = f"--optuna-storage {redacted(storage)}"
    path = journal_file(storage)
    if path is not None:
        if not path or path.endswith(("/", os.sep)) or Path(path).is_dir():
            raise UsageError(f"{flag}: expected journal:PATH of a file (e.g. journal:runs/optuna/journal.log)")
        folder = tracking.check_writable(Path(path).expanduser().parent, flag)
        return f"journal:{folder / Path(path).name}"
    import sqlalchemy
    from sqlalchemy.engine import make_url

    expected = "expected journal:PATH or a database URL such as postgresql://USER@HOST/DB or sqlite:///PATH"
    try:
        url = make_url(storage)
        url.get_dialect()
    except (sqlalchemy.exc.NoSuchModuleError, ImportError) as error:  # NoSuchModuleError is an ArgumentError: first
        raise UsageError(f"{flag}: no database driver for it ({tracking.first_error_line(str(error))}); {expected}") from None
    except sqlalchemy.exc.ArgumentError:
        raise UsageError(f"{flag}: not a storage URL; {expected}") from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise UsageError(f"{flag}: an in-memory sqlite database keeps nothing between the driver's connections; {expected}")
        tracking.check_writable(Path(url.database).expanduser().parent, flag)
    elif url.host:
        port = url.port or DEFAULT_PORTS.get(backend)
        if port:
            check_listening(url.host, port, flag, "expected a running database server")
    return storage


def check_photos(
    splits: DatasetSplits, dataset: str, image_size: int, data_root: str | os.PathLike | None, workers: int | None = None
) -> bool:
    """Every photo of ``splits`` (dataset ``dataset``) decodes, checked through the node's decoded cache
    (``trainables.core.cache``) at the trials' crop size (config key ``image_size``, 0 the dataset's default).

    A complete cache is read, nothing decoded: its build decoded each image once and stops at the first bad one.
    Else the driver builds it with ``workers`` processes (default: this machine's CPUs), and the trials on this node
    decode nothing again. A bad image is a ``DatasetError`` of one line naming its file.

    Returns whether the photos were checked: False for characters (decoded and checked when loaded) and when the
    cache is off (``$DML_CACHE_MAX_GB``, the disk's free space; the log says which): then the trials stream the files
    and a bad one fails its trial with the same line.
    """
    photos = any(s is not None and s.kind == "photos" and s.paths is not None for s in (splits.train, splits.test, splits.gallery))
    size = image_size_for(dataset, image_size)
    return photos and attach_cache(splits, size, data_root, workers=workers or os.cpu_count() or 1)
