"""The Ray session of a command: a fresh local Ray with the least it needs, or the cluster at --address; shared by
study.launch and study.final."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from study import checks, console

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the study
# Ray Tune adds CSV, JSON and TensorBoard loggers to every fit() unless this is "1": a study passes the CSV and JSON
# loggers itself and leaves TensorBoard out. MLflow holds every metric, and tensorboardX imports torch into the driver
# just as the trials' workers start, CPU they wait for on a small machine (docs/performance.md, measurements behind the
# code), and writes each result again.
AUTO_LOGGERS_FLAG = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"
# a local Ray listens on the loopback only (Ray reads this when it is imported), runs trials at normal priority (Ray's
# default niceness of 15 starves them beside any other work on the machine), and starts no idle workers ahead of need:
# by default it prestarts one per CPU as the driver connects, each importing Ray beside the driver's own start-up, and
# a study leaves most of them idle. These are Ray's system settings (RAY_ + the setting's name): Ray ignores a name it
# no longer knows, so tests/test_local_ray.py checks each one's effect. Its workers also inherit PYTHONWARNINGS=ignore
# from this environment: given as a job's runtime_env instead, Ray's runtime-env agent sets up every worker, and each
# starts slower. What each of these costs: docs/performance.md, measurements behind the code.
LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_worker_niceness": "0",
    "RAY_prestart_worker_first_driver": "0",
    "PYTHONWARNINGS": "ignore",
}


def local_ray_env(address: str | None) -> None:
    """Without --address, the environment of the local Ray (LOCAL_RAY_ENV; a user's own settings win). Before ``import ray``."""
    if address is None:
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)


@contextlib.contextmanager
def ray_session(address: str | None, local_resources: tuple[float | None, float | None] = (None, None)) -> Iterator[None]:
    """Ray for the length of the study; without --address always a fresh local Ray, never one that happens to run here,
    of ``local_resources`` (CPUs, GPUs; None: this machine's).

    The local Ray binds to 127.0.0.1 only when this is the first import of Ray in the process (as in ``main``).
    """
    local_ray_env(address)
    import ray

    console.keep_in_log_file("ray")  # a first import of Ray inside the command's log block put its console handler back
    cpus, gpus = local_resources
    try:
        ray.init(
            address=address or "local",
            num_cpus=cpus,
            num_gpus=gpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            ignore_reinit_error=True,
        )
    except ConnectionError as error:  # a cluster that listens (checks.check_address) but refuses this driver
        if address is None:
            raise
        raise checks.ray_connect_failure(address, error) from None
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()


def cluster_resources() -> dict[str, float]:
    """The running Ray cluster's resources (a local Ray's: this machine's)."""
    import ray

    return ray.cluster_resources()
