"""What the study commands show in the terminal, and where library noise goes instead.

- Commands a summary prints name this environment's interpreter and tools
  (``python_command``, ``env_tool``), so they run as printed without
  activating the environment.
- ``library_output_to`` sends Python warnings and the log records of Ray,
  Optuna, MLflow and their helpers to a log file (``log_path``), and turns off
  Ray Tune's own console output (its configuration table and TensorBoard hint),
  so the terminal shows the commands' own lines. The file keeps everything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from study.tracking import runs_dir

# Libraries whose log records go to the log file; "py.warnings" carries warnings.warn (logging.captureWarnings).
LIBRARY_LOGGERS = ("ray", "optuna", "mlflow", "alembic", "urllib3", "filelock", "matplotlib", "PIL", "py.warnings")


def log_path(name: str) -> Path:
    """The log file of the study (or final training) ``name``: ``<runs dir>/logs/NAME.log``."""
    return runs_dir() / "logs" / f"{name}.log"


@contextlib.contextmanager
def library_output_to(path: Path, loggers: tuple[str, ...] = LIBRARY_LOGGERS) -> Iterator[Path]:
    """Within the block, warnings and the libraries' log records (INFO and up) go to ``path`` (appended), not to the terminal.

    Enter it after importing Ray (its import installs its console handler on the "ray" logger, replaced here).
    On exit the loggers, the warnings machinery and the environment are as they were. Yields ``path``.
    """
    import optuna

    optuna.logging.get_logger("optuna")  # installs Optuna's console handler now, so that it is replaced here
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = {
        name: (list(logging.getLogger(name).handlers), logging.getLogger(name).propagate, logging.getLogger(name).level) for name in loggers
    }
    new_output = os.environ.get("RAY_AIR_NEW_OUTPUT")
    for name in loggers:
        logger = logging.getLogger(name)
        logger.handlers[:] = [h for h in logger.handlers if not _is_console(h)] + [handler]
        logger.propagate = False
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    # Ray Tune's console reporter prints its table and TensorBoard hint even with verbose=0; the
    # classic reporter (RAY_AIR_NEW_OUTPUT=0) prints nothing at verbose=0.
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    logging.captureWarnings(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # every distinct warning once per place, into the file
            yield path
    finally:
        logging.captureWarnings(False)
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:], logger.propagate = handlers, propagate
            logger.setLevel(level)
        handler.close()
        if new_output is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = new_output


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def env_tool(name: str) -> str:
    """``name`` as this environment runs it, shell-quoted: the interpreter for "python", else the tool
    beside it in the environment's bin folder (bare ``name`` when it is not there).

    Paths under the working folder are given relative to it (``.venv/bin/python``).
    """
    bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a link out of its bin folder
    path = Path(sys.executable) if name == "python" else bin_dir / name
    if not path.is_file():
        return name
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def python_command(module: str) -> str:
    """``<this interpreter> -m module``."""
    return f"{env_tool('python')} -m {module}"


def ui_command(uri: str) -> str:
    """How to open the MLflow UI on ``uri`` with this environment's mlflow."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri} in a browser"
    return f"{env_tool('mlflow')} ui --backend-store-uri {shlex.quote(uri)}"
