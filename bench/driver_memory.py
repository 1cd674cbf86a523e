"""python bench/driver_memory.py: what a finished trial keeps in the study's driver, piece by piece.

Two pieces the driver holds for every trial of a study until its end, each built alone in this process and
measured by Python's allocation tracer (``tracemalloc``: the heap after a full collection, before and after):

- Ray Tune's ``Trial`` object, given ``--epochs`` results, each of ``--numbers`` metrics of the trainable's own
  besides Tune's bookkeeping (8 numbers: the iteration, times, timestamp, pid, done) and the config. Tune keeps the
  last result and, for every number in it, its max, min, mean, last value and moving averages. The project's
  results carry about 25 numbers in all: 17 of its own;
- the same after Tune has snapshot it (the experiment's state file): the trial keeps that JSON;
- the Optuna study in a journal storage: one trial of ``--params`` parameters with ``--epochs`` intermediate values,
  told its value.

It prints KB per trial for each and what that makes at 5,000 trials. What it leaves out: the searcher's and
scheduler's state, Tune's snapshots, Ray's own objects, the allocator's fragmentation (RSS, not heap).

  python bench/driver_memory.py --trials 1000 --numbers 0 8 17
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

CONFIG = {"loss": "ice", "alpha": 12.3, "ice_scale": 30.1, "classes_per_batch": 16, "samples_per_class": 4, "normalization": "bn"}


def heap_per_item(build: Callable[[int], object], n: int) -> float:
    """Bytes of traced heap that ``n`` calls of ``build`` keep alive, per call."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    kept = [build(i) for i in range(n)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    del kept
    return (after - before) / n


def tune_trial(numbers: int, epochs: int, snapshot: bool = False) -> Callable[[int], object]:
    """``snapshot``: then Tune's snapshot of the trial's state (``Trial.get_json_state``, which the trial caches until
    it changes: a finished trial keeps it)."""
    from ray.tune.experiment import Trial

    def build(i: int) -> object:
        trial = Trial("train_trial", config=dict(CONFIG), trial_id=f"{i:08x}", stub=True)
        for epoch in range(1, epochs + 1):
            result = {f"metric_{k}": random.random() for k in range(numbers)}
            result.update(training_iteration=epoch, time_this_iter_s=0.05, time_total_s=0.05 * epoch, timestamp=1795680000 + epoch)
            result.update(time_since_restore=0.05 * epoch, iterations_since_restore=epoch, pid=1234, done=False, node_ip="127.0.0.1")
            result.update(trial_id=trial.trial_id, date="2026-11-26_10-00-00", hostname="head", config=dict(CONFIG))
            trial.update_last_result(result)
        if snapshot:
            trial.get_json_state()
        return trial

    return build


def optuna_trials(params: int, epochs: int, folder: Path) -> Callable[[int], object]:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(folder / "journal.log"))), direction="maximize")
    space = {f"param_{k}": optuna.distributions.FloatDistribution(0.0, 1.0) for k in range(params)}

    def build(i: int) -> None:  # the study holds what it is told; nothing to keep here
        trial = study.ask(space)
        for epoch in range(1, epochs + 1):
            trial.report(random.random(), epoch)
        trial.set_user_attr("ray_trial_id", f"{i:08x}")
        study.tell(trial, random.random())

    return build


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=8, help="results (intermediate values) per trial")
    parser.add_argument("--numbers", type=int, nargs="+", default=[0, 8, 17], help="the trainable's own numbers per result, each a row")
    parser.add_argument("--params", type=int, default=10, help="parameters per Optuna trial")
    args = parser.parse_args(argv)
    tracemalloc.start()
    rows = ["| piece | KB per trial | at 5,000 trials |", "| --- | ---: | ---: |"]

    def row(piece: str, size: float) -> str:
        return f"| {piece} | {size / 1024:.1f} | {size * 5000 / 2**20:.0f} MB |"

    for numbers in args.numbers:
        size = heap_per_item(tune_trial(numbers, args.epochs), args.trials)
        rows.append(row(f"Tune Trial, {args.epochs} results of {numbers} numbers + Tune's 8", size))
    size = heap_per_item(tune_trial(args.numbers[-1], args.epochs, snapshot=True), args.trials)
    rows.append(row(f"the same with {args.numbers[-1]}, after Tune's snapshot of it", size))
    with tempfile.TemporaryDirectory() as folder:
        size = heap_per_item(optuna_trials(args.params, args.epochs, Path(folder)), args.trials)
    rows.append(row(f"Optuna study, {args.params} params, {args.epochs} intermediate values", size))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
