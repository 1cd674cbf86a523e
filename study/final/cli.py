"""python -m study.final: retrain a fixed config on all training classes and test it.

Trains the config on the fit + validation classes (all of the dataset's
training classes) once per seed, evaluates on the unseen test classes, and
records everything in MLflow: params, per-epoch metrics, test metrics per seed
and their mean and spread, positive/negative pair similarity histograms, the
resolved config and the model as a pyfunc model (uint8 images in, l2-normalized
embeddings out).

Examples:
  python -m study.final --data-root ../shared/data              # HBN on Omniglot (embedded default)
  python -m study.final --config configs/omniglot_sm.yaml --seeds 3
  python -m study.final --space paper_ablation --seeds 3      # every variant of a grid space, 3 seeds each
  python -m study.final --study NAME --address auto --gpus-per-trial 1   # each seed a Ray task on a GPU worker

Where the seeds train (study/final/placement.py): on a Ray cluster (--address) each seed is a Ray task holding
--cpus-per-trial CPUs and --gpus-per-trial GPUs, the seeds side by side; on this machine side by side on the
cores when it has several (each seed's process with its share of torch threads), else one after another.
"""

from __future__ import annotations

import argparse
import logging
import math

from configs import DEFAULT_CONFIG
from study import inputs, names
from study.inputs import UsageError
from study.records import tracking
from trainables.core.config import DATA_ROOT_ENV

# what a study's final seeds train (--members): the race's tied candidates, decided on the validation classes
# (docs/findings.md, "The final model: the tie and the seeds as one model"), or the pick alone
MEMBERS = ("tied", "pick")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m study.final",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument(
        "--config",
        help=f"YAML file of config keys (TrainConfig in trainables/core/config.py); default: the embedded {DEFAULT_CONFIG}, "
        "heated-up softmax with BN features, alpha 16 -> 4, on Omniglot",
    )
    parser.add_argument(
        "--space",
        help="a grid or variants search space (file or shipped name): train every configuration of it with --seeds seeds, "
        "as children of one parent run named after the space (tag study_name), for a table with python -m study.report",
    )
    parser.add_argument(
        "--data-root",
        help=f"folder holding the datasets (default: with --study the study's own, else ${DATA_ROOT_ENV}); "
        "Omniglot is looked up in <root>/omniglot/",
    )
    parser.add_argument("--download", action="store_true", help="download Omniglot into the data root when it is missing (needs internet)")
    parser.add_argument(
        "--seeds", type=int, default=3, help="train this many seeds (config seed, +1, ...); report mean and spread (default 3)"
    )
    parser.add_argument("--epochs", type=int, help="override the config's epochs (e.g. 2 for a smoke run)")
    parser.add_argument(
        "--study",
        help="retrain the best config of this study (its parent run's best_config.yaml) on the study's data root; "
        "the seed runs become children of the study's parent run and the final model (the seeds as one model; "
        "with --seeds 1 the seed's) is registered as NAME-embedding",
    )
    parser.add_argument(
        "--members",
        choices=MEMBERS,
        help="with --study and --seeds > 1, what the seeds train: 'tied' (default), the candidates the study's race "
        "could not tell apart, best mean first (seed k trains the k-th, cycling; a clear pick trains alone), so the "
        "final model is the tie as one model; 'pick', the pick alone",
    )
    tracking.add_tracking_flags(
        parser.add_argument, f"MLflow experiment (default: final; with --study: {tracking.DEFAULT_EXPERIMENT}, as study.launch)", None
    )
    parser.add_argument("--run-name", help="name of the parent MLflow run (default: the config file's name)")
    parser.add_argument(
        "--register",
        metavar="NAME",
        help="register the final model (the seeds as one model; with --seeds 1 the seed's) in the MLflow registry under NAME "
        "(letters, digits, _ . -)",
    )
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument(
        "--num-workers",
        type=int,
        help="data-loading worker processes (default: photos on a GPU get the seed's CPUs - 1, everything else none)",
    )
    add_placement_flags(parser.add_argument)
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def add_placement_flags(a) -> None:
    """Where the seeds train: a Ray cluster and the resources of a seed's task there."""
    a(
        "--address",
        help="train each seed as a task of this running Ray cluster ('auto' on one of its nodes), the seeds side by side; "
        "default: this machine (side by side on its cores when it has several)",
    )
    a(
        "--cpus-per-trial",
        type=float,
        help="with --address: CPUs a seed's task holds, as many torch threads (default: the study's, else 1)",
    )
    a(
        "--gpus-per-trial",
        type=float,
        help="with --address: GPUs a seed's task holds; it trains on CUDA when > 0 (default: the study's, else 0)",
    )


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags' ranges and combinations (``parser.error``: one line, exit 2) and the name rule; fills --experiment."""
    if sum(bool(x) for x in (args.study, args.config, args.space)) > 1:
        parser.error("--study, --config and --space exclude each other: retrain a study's best config, a config file or a grid space")
    if args.experiment is None:
        args.experiment = tracking.DEFAULT_EXPERIMENT if args.study else "final"
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: expected an integer >= 1")
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs {args.epochs}: expected an integer >= 1")
    if args.num_workers is not None and args.num_workers < 0:
        parser.error(f"--num-workers {args.num_workers}: expected an integer >= 0")
    if args.cpus_per_trial is not None and not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        parser.error(f"--cpus-per-trial {args.cpus_per_trial}: expected a finite number > 0")
    if args.gpus_per_trial is not None and not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        parser.error(f"--gpus-per-trial {args.gpus_per_trial}: expected a finite number >= 0")
    for flag, value in (("--cpus-per-trial", args.cpus_per_trial), ("--gpus-per-trial", args.gpus_per_trial)):
        if value is not None and args.address is None:
            parser.error(f"{flag} sizes a seed's task on a Ray cluster; give --address (on this machine the seeds share its cores)")
    if args.members is not None and not args.study:
        parser.error(f"--members {args.members}: chooses what a study's final seeds train; give --study")
    args.members = args.members or MEMBERS[0]
    if args.device and args.address is not None:
        parser.error("--device: with --address a seed trains on CUDA when it holds a GPU (--gpus-per-trial), else on CPU")
    names.check_names({"--study": args.study, "--experiment": args.experiment, "--register": args.register})


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
    except UsageError as error:  # a name that breaks the name rule: one line, exit 2
        return inputs.print_error(error)
    what = f"study {args.study}'s pick" if args.study else f"the space {args.space}" if args.space else "the config"
    print(f"study.final: reading {what} and loading its data; training starts next", flush=True)  # at once, before the imports
    from study.final.run import run  # torch, MLflow and Ray load after the flags: --help and a bad flag answer at once

    return run(args)
