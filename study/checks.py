"""Checks of what a study will connect to, made before it does: the Ray cluster, the Optuna storage, the photos, and
whether the trials packed on a GPU fit its memory.

Each check answers in seconds with a :class:`study.inputs.UsageError` of one line
naming the flag, where the library it guards would retry for minutes (Ray, on an
address with nothing listening) or wait forever (Tune, on trials no node can
hold), or fail with a traceback (SQLAlchemy, on a URL it cannot parse).
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
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
        url.get_dialect().import_dbapi()  # the driver itself, not only SQLAlchemy's dialect of it
    except (sqlalchemy.exc.NoSuchModuleError, ImportError) as error:  # NoSuchModuleError is an ArgumentError: first
        extra = " (PostgreSQL: pip install -e '.[postgres]')" if storage.startswith("postgresql") else ""
        raise UsageError(f"{flag}: no database driver for it ({tracking.first_error_line(str(error))}){extra}; {expected}") from None
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


# The peak GPU memory of one training step (torch's allocator), GiB, with the batch and crop it was measured at, on one
# H200 by bench.gpu_path: photos in docs/bench/gpu_path.md (60 x 3 images of 224 px), characters in gpu_characters.md
# (32 x 4 of 32 px). Nearly all of it is activations (ResNet-50's weights, gradients and momentum are 0.3 GiB of 8.4),
# so it scales with the images a batch and their pixels. Backbones and precisions not measured are not checked.
STEP_PEAK_GIB: dict[tuple[str, str], tuple[float, int, int]] = {
    ("resnet50", "fp32"): (15.4, 180, 224),
    ("resnet50", "bf16"): (8.4, 180, 224),
    ("resnet50", "fp16"): (8.4, 180, 224),
    ("googlenet", "fp32"): (8.8, 180, 224),
    ("googlenet", "bf16"): (5.8, 180, 224),
    ("googlenet", "fp16"): (5.8, 180, 224),
    ("small_cnn", "fp32"): (0.2, 128, 32),
    ("small_cnn", "bf16"): (0.1, 128, 32),
}
# What nvidia-smi shows of a trial's process beyond its step's peak: CUDA's context and the allocator's cache (one
# small_cnn trial in bf16: 995 MiB at a 0.1 GiB peak; 16 of them 16,895 MiB: docs/bench/gpu_characters.json)
PROCESS_GIB = 0.9


@dataclass(frozen=True)
class Gpu:
    """A GPU as nvidia-smi names it, and its memory."""

    name: str
    gib: float


@dataclass(frozen=True)
class TrialShape:
    """What a trial's GPU memory depends on: its backbone and precision, its largest batch (C x k) and its crop."""

    backbone: str
    precision: str
    classes_per_batch: int
    samples_per_class: int
    image_size: int

    @property
    def batch(self) -> int:
        return self.classes_per_batch * self.samples_per_class

    def gpu_gib(self) -> float | None:
        """What one training trial takes of a GPU, GiB: its step's peak scaled from :data:`STEP_PEAK_GIB` to its batch and
        crop, plus :data:`PROCESS_GIB`; None for a backbone and precision not measured."""
        measured = STEP_PEAK_GIB.get((self.backbone, self.precision))
        if measured is None:
            return None
        peak, images, size = measured
        return peak * self.batch / images * (self.image_size / size) ** 2 + PROCESS_GIB


def local_gpus() -> list[Gpu]:
    """This machine's GPUs (nvidia-smi's name and memory.total); empty without nvidia-smi or a GPU."""
    query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            gpus.append(Gpu(name.strip(), int(mib) / 1024))
    return gpus


def packing_problem(what: str, shape: TrialShape, gpus_per_trial: float, gpu: Gpu) -> str | None:
    """Why the trials of ``what`` that ``gpus_per_trial`` packs on one GPU (a trial uses one GPU: 1 or more puts one
    trial on each) cannot share ``gpu``'s memory, with the numbers and the packing that fits; None when they fit or the
    backbone and precision were not measured."""
    need = shape.gpu_gib()
    if need is None:
        return None
    per_gpu = max(1, int(1 / gpus_per_trial + 1e-9))
    if per_gpu * need <= gpu.gib:
        return None
    peak, images, size = STEP_PEAK_GIB[(shape.backbone, shape.precision)]
    fits = int(gpu.gib // need)
    advice = (
        f"expected --gpus-per-trial {1 / fits:.3g} or more (at most {fits} trial(s) a GPU), or smaller batches"
        if fits
        else "expected smaller batches (classes_per_batch x samples_per_class) or image_size: one trial alone does not fit"
    )
    return (
        f"--gpus-per-trial {gpus_per_trial:g}: {per_gpu} trial(s) of {what} on a GPU of {gpu.gib:.1f} GiB ({gpu.name}) need "
        f"{per_gpu} x {need:.1f} = {per_gpu * need:.1f} GiB: {shape.backbone} in {shape.precision} on batches up to "
        f"{shape.classes_per_batch} x {shape.samples_per_class} = {shape.batch} images of {shape.image_size} px, "
        f"{need - PROCESS_GIB:.1f} GiB a step ({peak:g} GiB at {images} images of {size} px measured, scaled) "
        f"+ {PROCESS_GIB:g} GiB for its process's CUDA context; {advice}"
    )


def cluster_gpus(gpus_per_trial: float, timeout_s: float = 120.0) -> list[Gpu]:
    """The GPUs of a node of the running Ray cluster that holds a trial's GPU share, as a task there reads them
    (:func:`local_gpus`); empty when none answers within ``timeout_s``. Call after ``ray.init``."""
    import ray

    probe = ray.remote(num_cpus=0, num_gpus=gpus_per_trial)(local_gpus)
    ref = probe.remote()
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        return []
