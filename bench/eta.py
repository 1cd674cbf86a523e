"""How far the progress line's "~T left" is from the time the study really took.

Workload: what ``python -m study.launch`` printed (its stdout, saved with ``| tee``). Each progress line reads
``[  ELAPSED s, ~LEFT left] ...``; the truth for a line is the last progress line's elapsed seconds minus its own (the
end of the study's training: the summary after it is not counted by the estimate).

Question: is the estimate honest, and where it misses, is it the epochs it expected or the pace? With ``--runs`` (the
study's runs folder, its ``mlflow.db``) every epoch's time splits each estimate in two: the epochs it expected
against those the study trained after it, and the pace so far (seconds per epoch, all slots together) against the
pace that followed; a miss is put down to the factor that alone misses by more than 50 %. It also replays each
estimate with the pace of the last W seconds, and each line with this checkout's count of the epochs left
(``callbacks.study_epochs_left``) and with its whole rule (``callbacks.study_time_left``, the lines printed without an
estimate included: when the first one comes and how far it is) on the state the records give for that moment.

Bound (issue 32): every estimate within 50 % of the truth.

  python -m study.launch | tee /tmp/study.out && python -m bench.eta /tmp/study.out
  python -m bench.eta runs/launch.log --runs runs --study NAME --markdown docs/bench/eta.md
"""

from __future__ import annotations

import argparse
import bisect
import re
import statistics
import sys
from pathlib import Path

from bench import harness

LINE = re.compile(r"^\[\s*(\d+) s(?:, ~([^\]]+) left)?\]")
EVENT = re.compile(r"\| (\w{8}) epoch (\d+)/")  # the event of a progress line: Tune's trial id and the epoch
WINDOWS_S = (60, 120, 300)
UNITS = {"s": 1, "min": 60, "h": 3600}


def seconds(text: str) -> float:
    """``callbacks.format_duration``'s text back to seconds: "38 s", "4 min", "2.5 h"."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(h|min|s)\b", text)
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(value) * UNITS[unit] for value, unit in parts)


def estimates(lines: list[str]) -> list[tuple[float, float | None]]:
    """(elapsed s, estimated s left or None) of each progress line, in order."""
    found = []
    for line in lines:
        match = LINE.match(line.strip())
        if match:
            found.append((float(match[1]), seconds(match[2]) if match[2] else None))
    return found


def misses(found: list[tuple[float, float | None]]) -> list[tuple[float, float, float, float]]:
    """(elapsed s, estimate s, truth s, error as a share of the truth) of each line with an estimate and time left."""
    truths = [(elapsed, left, found[-1][0] - elapsed) for elapsed, left in found]
    return [(elapsed, left, truth, (left - truth) / truth) for elapsed, left, truth in truths if left is not None and truth > 0]


def table(found: list[tuple[float, float | None]]) -> tuple[list[str], str]:
    """The table's lines (elapsed, estimate, truth, error) and a summary sentence."""
    end, missed = found[-1][0], misses(found)
    errors = [error for *_, error in missed]
    rows = harness.table(
        ["elapsed s", "estimate s", "truth s", "error"],
        ((f"{e:.0f}", f"{left:.0f}", f"{truth:.0f}", f"{error:+.0%}") for e, left, truth, error in missed),
    )
    within = sum(abs(e) <= 0.5 for e in errors)
    worst = max(errors, key=abs, default=0.0)
    first = next((elapsed for elapsed, left in found if left is not None), None)
    first_error = next((f" ({error:+.0%})" for elapsed, *_, error in missed if elapsed == first), "")
    summary = (
        f"{within} of {len(errors)} estimates within 50 % of the truth (worst {worst:+.0%}); "
        f"the first estimate at {first} s of {end:.0f} s{first_error}; {sum(left is None for _, left in found)} lines without one"
    )
    return rows, summary


def study_records(runs: Path, study: str) -> tuple[dict[str, tuple[str, list[float]]], dict[str, str]]:
    """Each trial's and re-run's epoch times (s, sorted) by Tune trial id, with its kind ("trial" or "confirmation"),
    and the study's parent run params (its ``StudyRecord``)."""
    import mlflow

    from study.records.utilization import every_epoch

    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(experiments, filter_string=f"tags.study_name = '{study}'", max_results=5000)
    trials, params = {}, {}
    for run in found:
        kind = run.data.tags.get("kind")
        if kind == "study":
            params = run.data.params
        if kind in ("trial", "confirmation"):
            times = sorted(m.timestamp / 1000 for m in every_epoch(client, run.info.run_id, "train_loss"))
            trials[run.data.tags.get("trial_id")] = (kind, times)
    return trials, params


def epoch_times(trials: dict[str, tuple[str, list[float]]]) -> tuple[list[float], dict[tuple[str, int], float]]:
    """The times (s) of every epoch the study's trials and re-runs trained, sorted, and by (Tune trial id, epoch)."""
    by_epoch = {(tid, i + 1): t for tid, (_, times) in trials.items() for i, t in enumerate(times)}
    return sorted(by_epoch.values()), by_epoch


def progress_found(lines: list[str], by_epoch: dict[tuple[str, int], float]) -> tuple[list[tuple[float, float | None]], float]:
    """The progress lines' (elapsed s, estimate s or None), and the offset from the log's clock to MLflow's: the median
    over the lines that name a recorded epoch."""
    progress = [line for line in lines if LINE.match(line.strip())]
    found = [(elapsed, left, EVENT.search(line)) for line, (elapsed, left) in zip(progress, estimates(progress))]
    offsets = [by_epoch[(e[1], int(e[2]))] - elapsed for elapsed, _, e in found if e and (e[1], int(e[2])) in by_epoch]
    if not offsets:
        raise SystemExit("no progress line names an epoch recorded in MLflow: --runs and --study name another study")
    return [(elapsed, left) for elapsed, left, _ in found], statistics.median(offsets)


def split_errors(lines: list[str], times: list[float], by_epoch: dict[tuple[str, int], float]) -> str:
    """Each estimate's error put down to its epochs or its pace, and the estimate replayed with a recent pace."""
    from study.launch.callbacks import pace_since

    found, offset = progress_found(lines, by_epoch)  # offset: the log's clock to MLflow's
    end, total = found[-1][0], len(times)

    def done(elapsed: float) -> int:  # epochs trained by then
        return bisect.bisect_right(times, elapsed + offset)

    first = times[0] - offset
    counts = {"lines": 0, "within": 0, "epochs": 0, "pace": 0, **{w: 0 for w in WINDOWS_S}}
    for elapsed, left in found:
        truth, trained = end - elapsed, done(elapsed)
        if left is None or truth <= 0 or trained <= done(first) or trained >= total:
            continue
        pace = pace_since((first, done(first)), (elapsed, trained))  # what the estimate used: seconds per epoch so far
        counts["lines"] += 1
        counts["within"] += abs(left / truth - 1) <= 0.5
        counts["epochs"] += abs(left / pace / (total - trained) - 1) > 0.5  # the epochs expected against those trained
        counts["pace"] += abs(pace / (truth / (total - trained)) - 1) > 0.5  # the pace so far against the one that followed
        for w in WINDOWS_S:
            since = max(first, elapsed - w)
            recent = pace_since((since, done(since)), (elapsed, trained)) if trained > done(since) else pace
            counts[w] += abs(left * recent / pace / truth - 1) <= 0.5
    n = counts["lines"]
    windows = ", ".join(f"{counts[w]} of {n} with the pace of the last {w} s" for w in WINDOWS_S)
    return (
        f"{counts['within']} of {n} estimates within 50 % (lines with epochs still to train); off by more than 50 % on "
        f"their own: the epochs expected {counts['epochs']} times, the pace so far {counts['pace']} times. "
        f"Replayed: {windows}"
    )


def state_at(trials: dict[str, tuple[str, list[float]]], when: float) -> tuple[list[int], list[int], tuple[int, list[int]]]:
    """What the progress line saw at ``when`` (MLflow's clock): the epochs of the search trials that had ended (their
    last epoch reported) and of the running ones, the re-runs started and the running ones' epochs."""
    ended, running, started, rerun_running = [], [], 0, []
    for kind, times in trials.values():
        epochs = bisect.bisect_right(times, when)
        if epochs == 0:
            continue
        over = times[-1] <= when
        if kind == "trial":
            (ended if over else running).append(epochs)
        else:
            started += 1
            rerun_running += [] if over else [epochs]
    return ended, running, (started, rerun_running)


def replay(lines: list[str], trials: dict[str, tuple[str, list[float]]], params: dict[str, str]) -> str:
    """Each line's estimate made again with this checkout's count of the epochs left (``callbacks.study_epochs_left``)
    on the state the study's records give for that moment, times the pace so far: how the code as it is now would have
    done on the same study. Counted as in :func:`split_errors`."""
    from study.launch.callbacks import pace_since, study_epochs_left
    from study.records.study_record import StudyRecord
    from study.search.schedulers import ladder

    record = StudyRecord.from_params(params, where="the study's parent run")
    rungs = ladder(record.scheduler, record.epochs, record.grace_period, record.reduction_factor)[1]
    race, strata = (record.confirm_top, record.val_folds, record.confirm_budget), recorded_strata(record)
    times, by_epoch = epoch_times(trials)
    found, offset = progress_found(lines, by_epoch)
    first, end, total = times[0], found[-1][0], len(times)
    counts = {"lines": 0, "epochs": 0, "seconds": 0}
    for elapsed, left in found:
        when = elapsed + offset
        ended, running, reruns = state_at(trials, when)
        trained = bisect.bisect_right(times, when)
        if left is None or not ended or trained <= 1 or trained >= total or end - elapsed <= 0:
            continue
        epochs = study_epochs_left(ended, running, reruns, record.num_samples, record.epochs, rungs, race, strata)
        pace = pace_since((first, 1), (when, trained))  # seconds per epoch since the first
        counts["lines"] += 1
        counts["epochs"] += abs(epochs / (total - trained) - 1) <= 0.5
        counts["seconds"] += abs(epochs * pace / (end - elapsed) - 1) <= 0.5
    n = counts["lines"]
    return (
        f"Replayed with this checkout's epochs left: {counts['seconds']} of {n} estimates within 50 %; "
        f"the epochs expected within 50 % of those trained after the line {counts['epochs']} times"
    )


def replay_time_left(lines: list[str], trials: dict[str, tuple[str, list[float]]], params: dict[str, str]) -> str:
    """Every line's time left made again with this checkout's rule (``callbacks.study_time_left``) on the state the
    study's records give for that moment, the lines the study printed without one included: when the first estimate
    comes, how far it is from the truth, and how many are within 50 % of it (over the lines before the last epoch)."""
    from study.launch.callbacks import study_time_left
    from study.records.study_record import StudyRecord
    from study.search.schedulers import ladder

    record = StudyRecord.from_params(params, where="the study's parent run")
    rungs = ladder(record.scheduler, record.epochs, record.grace_period, record.reduction_factor)[1]
    race = (record.confirm_top, record.val_folds, record.confirm_budget)
    study = (record.num_samples, record.epochs, rungs, race, recorded_strata(record))
    times, by_epoch = epoch_times(trials)
    found, offset = progress_found(lines, by_epoch)
    end, total = found[-1][0], len(times)
    errors = []
    for elapsed, _ in found:
        when = elapsed + offset
        ended, running, reruns = state_at(trials, when)
        trained = bisect.bisect_right(times, when)
        if trained >= total or end - elapsed <= 0:
            continue
        left = study_time_left((times[0], 1), (when, trained), ended, running, reruns, study)
        if left is not None:
            errors.append((elapsed, (left - (end - elapsed)) / (end - elapsed)))
    if not errors:
        return "Replayed with this checkout's time left: no estimate"
    within = sum(abs(e) <= 0.5 for _, e in errors)
    worst = max((e for _, e in errors), key=abs)
    return (
        f"Replayed with this checkout's time left (strata: {study[-1]}): the first estimate at {errors[0][0]:.0f} s "
        f"({errors[0][1]:+.0%}); {within} of {len(errors)} within 50 % (worst {worst:+.0%})"
    )


def recorded_strata(record) -> int:
    """The strata the study's successive halving ran in (``settings.strata`` of its space file); 1 without a key it
    compared trials apart by, or where the space file is no longer there."""
    from study.launch.settings import strata
    from study.search.spaces import load_space

    if record.stratify_by is None or not Path(record.space).is_file():
        return 1
    return strata(load_space(record.space))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eta", description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the study's saved stdout")
    parser.add_argument("--markdown", type=Path, help="write the table and summary here")
    parser.add_argument("--runs", type=Path, help="the study's runs folder (DML_RUNS_DIR): split each error into epochs and pace")
    parser.add_argument("--study", help="the study's name (with --runs)")
    args = parser.parse_args(argv)
    if (args.runs is None) != (args.study is None):
        parser.error("--runs and --study go together")
    lines = args.output.read_text(errors="replace").replace("\r", "\n").splitlines()
    found = estimates(lines)
    if not found:
        raise SystemExit(f"{args.output}: no progress lines ('[  N s, ~T left] ...') in it")
    rows, summary = table(found)
    text = "\n".join(rows) + f"\n\n{summary}\n"
    if args.runs:
        trials, params = study_records(args.runs, args.study)
        text += "\n" + split_errors(lines, *epoch_times(trials)) + "\n"
        text += "\n" + replay(lines, trials, params) + "\n"
        text += "\n" + replay_time_left(lines, trials, params) + "\n"
    print(text)
    if args.markdown:
        harness.write(args.markdown, text)
    errors = [error for *_, error in misses(found)]
    within = sum(abs(e) <= 0.5 for e in errors)
    return harness.bound(
        within == len(errors) if errors else None, f"every estimate within 50 % of the truth ({within} of {len(errors)} are)"
    )


if __name__ == "__main__":
    sys.exit(main())
