"""python -m study.serve: serve a final model over REST, with limits on what a request may hold.

MLflow's own scoring app (the one `mlflow models serve` runs: /invocations, /ping, /health, /version) in this
process, behind a guard: a body over --max-body-mb is answered 413 (by its Content-Length before it is read, else when
the streamed bytes pass the limit), JSON nested deeper than --max-depth or holding more than --max-images images 400,
and every error reply is at most 8 KiB. The stock server reads any body whole, answers deep JSON with a 500 and
echoes a malformed body in its reply. The model loads from the store at $MLFLOW_TRACKING_URI (or --tracking-uri),
as study.final prints it.

Example:
  MLFLOW_TRACKING_URI=sqlite:///$PWD/runs/mlflow.db python -m study.serve -m models:/NAME-embedding/1 -p 5001
  curl -s http://127.0.0.1:5001/invocations -H 'Content-Type: application/json' -d '{"inputs": [[[0, 255], [255, 0]]]}'
"""

from __future__ import annotations

import argparse
import sys

from study import inputs
from study.inputs import UsageError

# A body of 64 MiB holds about a hundred 224 x 224 RGB photos as JSON integers (about 600 kB each).
MAX_BODY_MB = 64.0
# {"inputs": [N][H][W][C]} is 5 deep (the top object, the batch, rows, pixels, channels); {"instances": [{"images":
# [H][W][C]}]} 6. Two levels spare; Python's JSON parser recurses once a level and fails near 1,000.
MAX_DEPTH = 8
# Images a request: four batches of the model's 256. One image sent without its batch axis counts its rows.
MAX_IMAGES = 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m study.serve", description=doc[1], epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "-m", "--model-uri", help="the model: models:/NAME/VERSION as study.final prints it, models:/m-..., runs:/... or a folder"
    )
    parser.add_argument("-p", "--port", type=int, default=5001, help="port to listen on (default 5001)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)"
    )
    parser.add_argument("--tracking-uri", help="the store the model URI is read from (default $MLFLOW_TRACKING_URI)")
    parser.add_argument(
        "--max-body-mb", type=float, default=MAX_BODY_MB, help=f"largest request body in MiB (default {MAX_BODY_MB:g}); larger: 413"
    )
    parser.add_argument(
        "--max-depth",
        type=int,
        default=MAX_DEPTH,
        help=f"deepest JSON nesting (default {MAX_DEPTH}; a batch of RGB images is 5); deeper: 400",
    )
    parser.add_argument("--max-images", type=int, default=MAX_IMAGES, help=f"most images a request (default {MAX_IMAGES}); more: 400")
    args = parser.parse_args(argv)
    if not args.model_uri:  # checked after parsing: an unknown flag is named first
        parser.error("the following arguments are required: -m/--model-uri")
    return args


def check(args: argparse.Namespace) -> None:
    """The flags' values, a UsageError naming the first one out of range."""
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: expected 1 to 65535")
    if not 0 < args.max_body_mb <= 4096:  # float('nan') fails too
        raise UsageError(f"--max-body-mb {args.max_body_mb:g}: expected more than 0 and at most 4096 (MiB)")
    if not 4 <= args.max_depth <= 100:
        raise UsageError(f"--max-depth {args.max_depth}: expected 4 to 100 (a batch of images is 4 or 5 deep)")
    if args.max_images < 1:
        raise UsageError(f"--max-images {args.max_images}: expected at least 1")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check(args)
    except UsageError as error:
        return inputs.print_error(error)
    # MLflow, uvicorn and the model load after the flags: --help and a bad flag answer at once
    import logging

    import mlflow
    import uvicorn
    from mlflow.pyfunc import scoring_server

    from study.serve.guard import MIB, Guard, Limits

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.tracking_uri:
        mlflow.set_tracking_uri(args.tracking_uri)
    try:
        model = mlflow.pyfunc.load_model(args.model_uri)
    except (mlflow.exceptions.MlflowException, OSError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = inputs.redacted(mlflow.get_tracking_uri())
        return inputs.print_error(f"-m {args.model_uri}: cannot load it from {where} ({message}); expected a logged model's URI")
    limits = Limits(max_body=int(args.max_body_mb * MIB), max_depth=args.max_depth, max_images=args.max_images)
    app = Guard(scoring_server.init(model), limits)
    print(f"serving {args.model_uri} on http://{args.host}:{args.port}/invocations (Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
