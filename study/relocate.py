"""python -m study.relocate: bind a runs folder that was moved or copied to where it is now.

A local MLflow store keeps absolute paths (artifact locations, a study's journal and checkpoints): a copy of a runs
folder would still read and write the original's. Every command rebinds a moved store before anything else
(``study.records.store``); this command does only that, for a store you open with ``mlflow ui`` before running
any other command on it.

Example:
  rsync -a head:dml/runs/ ~/runs-from-cluster/
  DML_RUNS_DIR=~/runs-from-cluster python -m study.relocate
"""

from __future__ import annotations

import argparse
import sys

from study import inputs
from study.inputs import UsageError
from study.records import store, tracking
from study.records.store import rebind_if_moved


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m study.relocate",
        description=doc[0],
        epilog="\n\n".join(doc[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tracking-uri", help="the store (default: $MLFLOW_TRACKING_URI, else sqlite:///<runs folder>/mlflow.db)")
    args = parser.parse_args(argv)
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    try:
        if not store.is_local_sqlite(uri):
            raise UsageError(f"--tracking-uri {inputs.redacted(uri)}: a server keeps its own paths; expected a local sqlite:///PATH store")
        if not store.sqlite_file(uri).is_file():
            raise UsageError(f"--tracking-uri {uri}: no such store; expected sqlite:///PATH/mlflow.db of a runs folder")
        if rebind_if_moved(uri) is None:
            print(f"{store.sqlite_file(uri)}: its paths already name {store.sqlite_file(uri).resolve().parent}; nothing to do")
    except UsageError as error:
        return inputs.print_error(error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
