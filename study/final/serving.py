"""How a final model is served: the REST commands study.final prints (``python -m study.serve``), with an image small
enough to type."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from study import inputs
from study.final.results import ConfigurationResult, FinalResult
from study.records import store

# One 8 x 8 image, (N, H, W) = (1, 8, 8): a dark cross on white, drawn as Omniglot draws strokes; small enough to type.
CURL_IMAGE = [[0 if (1 <= r <= 6 and c in (3, 4)) or (1 <= c <= 6 and r in (3, 4)) else 255 for c in range(8)] for r in range(8)]


def serve_commands(uri: str, model_uri: str, port: int = 5001) -> list[str]:
    """Shell lines that serve ``model_uri`` over REST with this environment's Python (``study.serve``: MLflow's scoring
    app behind request limits), and ask it for one embedding.

    The interpreter is named by its full path and the store by an absolute URI, so the line works from any folder.
    """
    if store.is_local_sqlite(uri):  # the command must work from any folder
        uri = f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    python = shlex.quote(sys.executable)  # not resolved: a venv's python is a link out of its bin folder
    serve = f"MLFLOW_TRACKING_URI={shlex.quote(uri)} {python} -m study.serve -m {shlex.quote(model_uri)} -p {port}"
    payload = json.dumps({"inputs": [CURL_IMAGE]}, separators=(",", ":"))
    curl = f"curl -s http://127.0.0.1:{port}/invocations -H 'Content-Type: application/json' -d '{payload}'"
    return [serve, curl]


def served_model(outcome: ConfigurationResult) -> str:
    """The model the closing lines serve: the seeds' ensemble (its registered version if any), else the first seed's."""
    chosen = outcome.ensemble or outcome.seeds[0]
    return chosen.registered_uri or chosen.model_uri


def print_serving(result: FinalResult) -> None:
    """How to serve the first configuration's model (:func:`served_model`) and query it."""
    model_uri = served_model(result.configurations[0])
    serve, curl = serve_commands(inputs.redacted(result.uri), model_uri)
    print(f"\nserve {model_uri} over REST (Ctrl-C stops it):\n  {serve}")
    print(f"then embed images (JSON lists of 0..255, (N, H, W) or (N, H, W, C); here one 8 x 8 image):\n  {curl}")
