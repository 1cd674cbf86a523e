"""python -m study.launch: a hyperparameter study with Optuna TPE + ASHA on Ray, recorded in MLflow.

Every trial trains the training core on the fit classes and is scored on the
validation classes (never on the test classes). Optuna's TPE (seeded)
proposes configs from a YAML search space; ASHA stops weak trials at rungs
measured in epochs, and those trials reach Optuna as PRUNED. The driver writes
one MLflow parent run per study and one child run per trial; at the end the
parent gets best_config.yaml, a CSV of all trials and plots. Then
`python -m study.final --study NAME` retrains the best config and tests it.

Examples:
  python -m study.launch                                   # default space, Omniglot, local Ray/MLflow/Optuna
  python -m study.launch --space smoke --num-samples 4     # a quick check of a set-up (generated data)
  python -m study.launch --space search_spaces/ice.yaml --num-samples 40 --epochs 20 --address auto
  python -m study.launch --study-name NAME --resume        # continue an interrupted study
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable
from typing import Any

from study import inputs, names
from study.inputs import UsageError, given_flags
from study.records import tracking
from study.records.study_record import METRICS
from study.records.tracking import DEFAULT_EXPERIMENT
from study.search.race import RACE_FOLDS
from study.search.schedulers import SAMPLERS, SCHEDULERS
from trainables.core.config import DATA_ROOT_ENV, RANGES

log = logging.getLogger(__name__)

SEED_MAX = int(RANGES["seed"].high)  # the sampler's seed takes the range of a config's seed


# ----------------------------------------------------------------------------- the command line
def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m study.launch", description=doc[1], epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_search_flags(parser.add_argument_group("what to search").add_argument)
    add_race_flags(parser.add_argument_group("how the best is named").add_argument)
    add_cluster_flags(parser.add_argument_group("where trials run").add_argument)
    add_record_flags(parser.add_argument_group("where the study is recorded").add_argument)
    return parser


def add_search_flags(a: Callable[..., argparse.Action]) -> None:
    """The space, its data, the budget and how trials are sampled, stopped and confirmed."""
    a(
        "--space",
        help="search space: a YAML file, or the name of a shipped one in search_spaces/ "
        "(default, heated_softmax, ice, paper_ablation, smoke; the photo benchmarks at the papers' protocol: cub200, cars196, "
        "sop, inshop; and the repro_* grids of docs/findings.md); "
        "default: default (with --resume: the study's own)",
    )
    a("--dataset", help="override the space's dataset (omniglot, cub200, cars196, sop, inshop, folder, synthetic)")
    a("--data-root", help=f"folder holding the datasets (default: ${DATA_ROOT_ENV}); every node of a cluster needs it at this path")
    a("--num-samples", type=int, help="number of trials (default: 16; a grid space runs each grid point once)")
    a("--epochs", type=int, help="epochs per trial, the ASHA max_t (default: the space's epochs)")
    a(
        "--scheduler",
        choices=SCHEDULERS,
        help="early stopping: budget (default; successive halving where every rung judges a schedule scaled to its budget, "
        "heating and lr decay included), asha (stock ASHA, judging mid-schedule: the baseline) or fifo (none)",
    )
    a("--grace-period", type=int, help="the first rung, in epochs (default: a quarter of the epochs)")
    a("--reduction-factor", type=float, help="keep the top 1/factor at each rung (default 4)")
    a("--metric", default="val_recall_at_1", help=f"validation metric to maximize: {', '.join(METRICS)} (default val_recall_at_1)")
    a(
        "--sampler",
        choices=SAMPLERS,
        default="tpe",
        help="how a searched space is sampled: tpe (default; ASHA-stopped trials told as PRUNED) or random (a baseline); "
        "grid spaces always use the grid",
    )
    a("--seed", type=int, default=0, help="seed of the sampler (trials keep their config's seed)")
    a("--confirm-top", type=int, default=3, help="before naming the best, race this many top complete trials (default 3)")
    a(
        "--confirm-budget",
        type=float,
        default=0.6,
        metavar="FRACTION",
        help="the race's budget, a share of the epochs the search trained: the top trials re-train on other validation folds "
        "in rounds, the clearly beaten are dropped, until one leads beyond noise or the budget or folds run out "
        "(study.search.race; default 0.6: in the default study, two rounds of 3 and the race's first test; 0: name the "
        "single best score)",
    )


def add_race_flags(a: Callable[..., argparse.Action]) -> None:
    """Which folds the race of the top trials holds out (study.search.race)."""
    a(
        "--race-folds",
        choices=RACE_FOLDS,
        default="trial",
        help="the validation folds the race re-trains the top trials on: trial (default: the trials' own split, config key "
        "val_split) or alphabets (whole held-out alphabets, as the test of a characters dataset measures, whatever the "
        "trials' split; needs alphabet/character class names)",
    )


def add_cluster_flags(a: Callable[..., argparse.Action]) -> None:
    """The Ray cluster, the resources of a trial, and what happens when a trial fails."""
    a("--address", help="join a running Ray cluster (e.g. 'auto' on a node of a `ray up` cluster); default: a local Ray")
    a(
        "--max-concurrent",
        type=int,
        help="trials running at once (default: as many as the cluster's CPUs and GPUs hold at --cpus-per-trial / --gpus-per-trial); "
        "1, with --cpus-per-trial set to the cores, repeats a seeded study on the same machine (README: What a sampler seed fixes)",
    )
    a("--cpus-per-trial", type=float, default=1.0, help="CPUs reserved per trial (default 1); torch uses that many threads")
    a("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial; fractions pack several trials on one GPU (default 0)")
    a("--max-failures", type=int, default=1, help="retries of a failed trial from its last checkpoint (default 1)")
    a(
        "--checkpoint-every",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a trial checkpoints an epoch at most every SECONDS (default 60; 0: every epoch): a stopped, killed or moved "
        "trial retrains at most that much, and Tune's snapshots of the whole study stay rare (docs/performance.md)",
    )
    a(
        "--rehearse",
        nargs="?",
        type=float,
        const=1.0,
        metavar="SECONDS",
        help="rehearse the study: the same driver, searcher, scheduler, re-runs and records, on a surrogate trainable that "
        "trains nothing (trainables.surrogate: seeded learning curves shaped like real ones) and sleeps SECONDS per epoch "
        "(default 1); no dataset needed. Checks a space, its rungs, its budget and the volume of records before a cluster run",
    )
    a(
        "--ray-cpus",
        type=float,
        help="logical CPUs of the local Ray (default: this machine's); with --rehearse, the size of the cluster rehearsed",
    )
    a("--ray-gpus", type=float, help="logical GPUs of the local Ray (default: this machine's); with --rehearse, GPUs to rehearse")
    a(
        "--reuse-actors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run a new trial in the worker process of a finished one, without a new process and fresh imports (default: on)",
    )


def add_record_flags(a: Callable[..., argparse.Action]) -> None:
    """The stores (Ray checkpoints, MLflow, Optuna) and the study's name."""
    a("--storage-path", help="where Ray keeps trial checkpoints; on a cluster a shared path or s3:// URI (default: ./runs/ray)")
    tracking.add_tracking_flags(a, f"MLflow experiment name (default {DEFAULT_EXPERIMENT})")
    a("--optuna-storage", help="Optuna storage: journal:PATH or a database URL (default: journal:./runs/optuna/journal.log)")
    a("--study-name", help="name of the study (letters, digits, _ . -); default: <space>-<date>-<time>")
    a(
        "--resume",
        action="store_true",
        help="continue the interrupted study --study-name: finished trials are kept, interrupted ones continue from their checkpoints",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, each flag checked on its own (what needs the space or the dataset is checked in ``study_settings``)."""
    parser = build_parser()
    args = parser.parse_args(argv)

    def bad(flag: str, value: Any, expected: str) -> None:
        parser.error(f"{flag} {value}: expected {expected}")

    if not 0 <= args.seed <= SEED_MAX:
        bad("--seed", args.seed, f"an integer from 0 to {SEED_MAX}")
    if args.num_samples is not None and args.num_samples < 1:
        bad("--num-samples", args.num_samples, "an integer >= 1")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        bad("--max-concurrent", args.max_concurrent, "an integer >= 1")
    if not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        bad("--cpus-per-trial", args.cpus_per_trial, "a finite number > 0")
    if not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        bad("--gpus-per-trial", args.gpus_per_trial, "a finite number >= 0")
    if args.epochs is not None and args.epochs < 1:
        bad("--epochs", args.epochs, "an integer >= 1")
    if args.confirm_top < 1:
        bad("--confirm-top", args.confirm_top, "an integer >= 1")
    if not 0 <= args.confirm_budget <= 100:
        bad("--confirm-budget", args.confirm_budget, "a share of the search's epochs from 0 to 100 (e.g. 0.6)")
    if args.grace_period is not None and args.grace_period < 1:
        bad("--grace-period", args.grace_period, "an integer >= 1")
    if args.reduction_factor is not None and not (math.isfinite(args.reduction_factor) and args.reduction_factor > 1):
        bad("--reduction-factor", args.reduction_factor, "a finite number > 1")
    if args.metric not in METRICS:
        bad("--metric", args.metric, f"one of {', '.join(METRICS)}")
    if args.rehearse is not None and not (math.isfinite(args.rehearse) and args.rehearse >= 0):
        bad("--rehearse", args.rehearse, "seconds per epoch, a finite number >= 0")
    for flag, value in (("--ray-cpus", args.ray_cpus), ("--ray-gpus", args.ray_gpus)):
        if value is not None and not (math.isfinite(value) and value >= (1 if flag == "--ray-cpus" else 0)):
            bad(flag, value, "a finite number >= 1" if flag == "--ray-cpus" else "a finite number >= 0")
        if value is not None and args.address is not None:
            parser.error(f"{flag} sizes the local Ray; drop it with --address (a running cluster has its own resources)")
    if args.max_failures < 0:
        bad("--max-failures", args.max_failures, "an integer >= 0")
    if not (math.isfinite(args.checkpoint_every) and args.checkpoint_every >= 0):
        bad("--checkpoint-every", args.checkpoint_every, "seconds, a finite number >= 0")
    if args.resume and not args.study_name:
        parser.error("--resume needs --study-name NAME (the study to continue)")
    args.given = given_flags(parser, argv)
    try:
        names.check_names({"--study-name": args.study_name, "--experiment": args.experiment})
    except UsageError as error:  # one line and exit 2, as every bad flag (parser.error would add the usage line)
        raise SystemExit(inputs.print_error(error)) from None
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    # at once, before the seconds of imports, checks and Ray's start that the study's own first line waits for
    what = f"resuming study {args.study_name}: reading its record" if args.resume else "checking the space, the data and the stores"
    where = f"joining the Ray cluster at {args.address}" if args.address else "starting a local Ray"
    print(f"study.launch: {what}, then {where}", flush=True)
    from study.launch.run import (
        launch,  # MLflow, Optuna and Ray load after the flags: --help and a bad flag answer at once
    )

    return launch(args)
