"""Verdicts across sampler seeds: does the default study pick an equally good model, and the same one, whatever its seed?

Workload: the default study (``python -m study.launch``, the default space) and then ``python -m study.final --study
NAME --seeds 3`` on its pick, one after another: one study per sampler seed (``--seeds``, default 0 1 2 3 4), named
``verdicts-seedS``, and ``--repeats`` runs in all of one sampler seed (``--repeat-seed``; the study of that seed above
counts as the first). With 2 trials at a time the trials finish in another order from run to run, so TPE may see
another history. Each study has its own runs folder (``--keep``/NAME: its MLflow store, Optuna journal, Ray
checkpoints and both commands' logs). For each study: the wall time, the utilization, the pick and its key params,
the race's verdict and why it stopped, and the test metrics of the model study.final makes. The summary: the mean and
spread (max - min) of those over the sampler seeds, the families that won, and whether the repeats picked the same
configuration, or different ones their races could not tell apart (a tie), or one a race called clear and another
did not pick (a contradiction).

An interrupted benchmark continues where it stopped: a study with results in ``--keep`` is skipped.

Question: is the default study's verdict as good, and as reproducible, as the seeds allow?

Bound (issue 31): over the sampler seeds, the final models' test R@1 has a mean of at least 0.86 and a spread of at
most 1.5 points, their mean 20-way one-shot error is at most 22 %, and the repeats never contradict each other.

Run it on an otherwise idle machine (the trial order, hence the picks, depends on the load):

  DML_DATA_ROOT=../shared/data python -m bench.verdicts                   # 7 studies + 7 finals, one at a time
  python -m bench.verdicts --data-root ../shared/data --seeds 0 1 --repeats 0 --final-seeds 1 --final-epochs 2 \\
      --extra "--num-samples 3 --epochs 2 --max-concurrent 2" --keep /tmp/verdicts-tiny --out /tmp/verdicts-tiny.json \\
      --markdown /tmp/verdicts-tiny.md                                     # a smoke run: minutes

Results: docs/bench/verdicts.{json,md} (``--out``, ``--markdown``); the table is printed as well.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import ROOT

PREFIX = "verdicts"
RESULT_FILE = "verdicts_result.json"
TESTS = ("recall_at_1", "map_at_r", "one_shot_error")  # what the summary states of each pick's final
SAME, TIE, CONTRADICTION = "same configuration", "tie", "contradiction"  # the reproducibility judgements


@dataclass(frozen=True)
class Run:
    """One study of the benchmark: its name, its sampler seed and its place among the runs of that seed (1: first)."""

    name: str
    seed: int
    repeat: int = 1


def plan_runs(seeds: Sequence[int], repeats: int, repeat_seed: int) -> list[Run]:
    """The studies to run, in order: one per sampler seed, then the further runs of ``repeat_seed`` (``repeats`` in
    all, the study of that seed among ``seeds`` counting as the first)."""
    runs = [Run(f"{PREFIX}-seed{s}", s) for s in dict.fromkeys(seeds)]
    first = 2 if repeat_seed in seeds else 1
    runs += [Run(f"{PREFIX}-seed{repeat_seed}-repeat{i}", repeat_seed, i) for i in range(first, repeats + 1)]
    return runs


def spread_and_mean(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """Mean, min, max and spread (max - min) of the measured ``values`` (None: not measured, left out)."""
    measured = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not measured:
        return {"n": 0, "mean": None, "min": None, "max": None, "spread": None}
    low, high = min(measured), max(measured)
    return {"n": len(measured), "mean": sum(measured) / len(measured), "min": low, "max": high, "spread": high - low}


def family_counts(families: Sequence[str]) -> dict[str, Any]:
    """How often each configuration family won, the most frequent first (ties: the family that won first), and the
    families that won most often (several on a tie)."""
    counts = Counter(families)
    ordered = sorted(counts, key=lambda f: (-counts[f], families.index(f)))
    top = counts[ordered[0]] if ordered else 0
    return {"counts": {f: counts[f] for f in ordered}, "most": [f for f in ordered if counts[f] == top], "wins": top, "of": len(families)}


def reproducibility(picks: Sequence[tuple[str, bool]]) -> dict[str, Any]:
    """Whether runs of one command with one sampler seed gave the same verdict. ``picks``: (the picked configuration,
    in any comparable form; whether the race called it clear) per run.

    same configuration: every run picked it. tie: the picks differ and no race called its pick clear, so the runs
    agree that the race could not tell the candidates apart. contradiction: a run called its pick clear and another
    run picked another configuration.
    """
    if len(picks) < 2:
        return {"runs": len(picks), "judgement": None, "distinct": len({c for c, _ in picks})}
    distinct = len({config for config, _ in picks})
    if distinct == 1:
        judgement = SAME
    elif any(clear for _, clear in picks):
        judgement = CONTRADICTION
    else:
        judgement = TIE
    return {"runs": len(picks), "judgement": judgement, "distinct": distinct}


def leading_same(first: Sequence[Any], other: Sequence[Any]) -> int:
    """How many leading items ``other`` shares with ``first``: the trials two runs proposed (or ended) alike before they
    went apart."""
    count = 0
    for a, b in zip(first, other):
        if a != b:
            break
        count += 1
    return count


def called_clear(selection: dict[str, Any] | None) -> bool:
    """Whether a study's selection record (study.search.race.selection_record) says its pick is clear."""
    return bool(selection) and str(selection.get("verdict", "")).startswith("clear")


def short_verdict(selection: dict[str, Any] | None) -> str:
    """The verdict in a few words for the table: clear or undecided, why the race stopped, after how many folds."""
    if not selection:
        return "no race"
    verdict = str(selection.get("verdict", ""))
    head = verdict.split(":")[0]
    if "stopped" not in selection:  # a record from before the race: seed re-runs
        return f"{head} (seed re-runs, lead {selection.get('lead_in_se', math.nan):.1f} SE)"
    if head == "one candidate":
        return head
    # as study.search.race words it: clear, the largest p of the dropped; undecided, the smallest of the survivors
    others = [e for e in selection.get("ranking", [])[1:] if head == "clear" or e.get("dropped_after_folds") is None]
    p_values = [e["p_value"] for e in others if e.get("p_value") is not None and math.isfinite(e["p_value"])]
    p = f", Holm p {'<=' if head == 'clear' else '='} {(max if head == 'clear' else min)(p_values):.3f}" if p_values else ""
    why = "" if selection["stopped"] == head else f"{selection['stopped']}, "
    return f"{head} ({why}{selection.get('folds', '?')} folds{p})"


def family(config: dict[str, Any]) -> str:
    """The configuration family of a pick: ICE, heated softmax or softmax without heating."""
    if config.get("loss") == "ice":
        return "ICE"
    return "softmax without heating" if config.get("heating", "none") == "none" else "heated softmax"


def key_params(config: dict[str, Any]) -> str:
    """The searched params of a default-space pick that tell it apart, in the words of docs/findings.md."""
    if config.get("loss") == "ice":
        head = [f"s {config.get('ice_scale', math.nan):.1f}"]
    else:
        alpha = f"alpha {config.get('alpha', math.nan):.2f}"
        if config.get("heating", "none") != "none":
            alpha += f" -> {config.get('heating_target', math.nan):.2f} ({config['heating']})"
        head = [str(config.get("normalization")), *(["weight norm"] if config.get("weight_norm") else []), alpha]
        if config.get("mean_proxy_weight"):
            head.append(f"mean proxy {config['mean_proxy_weight']:g}")
    batch = f"{config.get('classes_per_batch')} x {config.get('samples_per_class')}"
    lr = f"lr {config.get('lr', math.nan):.1e} {config.get('lr_schedule', '')}".rstrip()
    return ", ".join([*head, batch, f"{config.get('embedding_dim')}-d", lr])


def config_identity(config: dict[str, Any]) -> str:
    """The configuration as a canonical string of the keys that change how it trains (two picks are the same
    configuration when these are equal)."""
    from trainables.core.config import TrainConfig, applicable_keys

    resolved = TrainConfig.from_dict(config, source="a pick's config")
    values = resolved.to_dict()
    return json.dumps({key: values[key] for key in applicable_keys(resolved)}, sort_keys=True, default=str)


def study_env(folder: Path, data_root: str | None) -> dict[str, str]:
    """The environment of a study's commands: its own runs folder (its MLflow store, Optuna journal, Ray storage and
    logs), the data root; no ``MLFLOW_TRACKING_URI`` of the caller's, which would send every study to one store."""
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    env["DML_RUNS_DIR"] = str(folder)
    if data_root:
        env["DML_DATA_ROOT"] = data_root
    return env


def python_of(checkout: Path) -> str:
    """The interpreter that runs the commands in ``checkout``: its .venv's, else this one."""
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if checkout.resolve() != ROOT and venv.is_file() else sys.executable


def launch_command(run: Run, args: argparse.Namespace) -> list[str]:
    data = ["--data-root", args.data_root] if args.data_root else []
    return [python_of(args.checkout), "-m", "study.launch", "--study-name", run.name, "--seed", str(run.seed), *data, *args.extra]


def final_command(run: Run, args: argparse.Namespace) -> list[str]:
    data = ["--data-root", args.data_root] if args.data_root else []
    epochs = ["--epochs", str(args.final_epochs)] if args.final_epochs else []
    return [python_of(args.checkout), "-m", "study.final", "--study", run.name, "--seeds", str(args.final_seeds), *epochs, *data]


def stop(process: subprocess.Popen) -> None:
    """Ask a command to stop as Ctrl-C does (study.launch saves its state and marks its runs KILLED; a second
    Ctrl-C, forwarded too, stops it at once) and wait for its end, so that no driver is killed before Ray is down."""
    for _ in range(2):
        process.send_signal(signal.SIGINT)
        try:
            process.wait()
            return
        except KeyboardInterrupt:
            continue
    process.wait()


def run_logged(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> float:
    """Run ``command`` to its end with its output in ``log``; its wall seconds. A failure raises with the log's tail.

    The command runs in a session of its own and a stop of the benchmark (Ctrl-C, SIGTERM, SIGHUP) reaches it once,
    forwarded by ``stop``: subprocess.run would kill it 0.25 s after a Ctrl-C, and leave Ray's agents running.
    """
    shown = f"DML_RUNS_DIR={shlex.quote(env['DML_RUNS_DIR'])} " + shlex.join(command)
    print(f"$ {shown}\n  (output: {log})", flush=True)
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {shown}\n")
        out.flush()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait()
        except KeyboardInterrupt:
            stop(process)
            raise
    elapsed = time.perf_counter() - started
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"{command[2]} exited with {code} after {elapsed:.0f} s; the end of {log}:\n{tail}")
    print(f"  done in {elapsed:.0f} s", flush=True)
    return elapsed


def parent_run(folder: Path, name: str):
    """The MLflow parent run of study ``name`` in the store of its runs folder, or None."""
    from mlflow import MlflowClient

    from study.records import tracking

    db = folder / "mlflow.db"
    if not db.is_file():
        return None
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("dml-studies")
    return tracking.find_study_run(client, experiment.experiment_id, name) if experiment else None


def test_metric_keys() -> dict[str, str]:
    """The parent-run metric of each of ``TESTS`` that study.final --study logs (mean over its seeds: the pick's, or after an
    undecided race the tied candidates', one seed each)."""
    from trainables.core.engine import ONE_SHOT_WAYS

    names = {"recall_at_1": "test_recall_at_1", "map_at_r": "test_map_at_r", "one_shot_error": f"test_one_shot_error_{ONE_SHOT_WAYS}way"}
    return {key: f"final_{metric}_mean" for key, metric in names.items()}


def optuna_study(folder: Path, name: str):
    """Study ``name`` from the Optuna journal of its runs folder (loaded once per study: it is read whole)."""
    import optuna

    from study.search.journal import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(f"journal:{folder / 'optuna' / 'journal.log'}"))


def optuna_pick(study) -> tuple[int | None, dict[str, Any], dict[str, Any] | None]:
    """(picked Optuna trial, its config, the selection record) of an Optuna study."""
    number = study.user_attrs.get("picked_trial")
    config = study.trials[number].user_attrs.get("config", {}) if number is not None else {}
    return number, config, study.user_attrs.get("selection")


def trial_sequence(study) -> dict[str, list]:
    """An Optuna study's trials in number order: ``proposals``, each trial's searched params (the sampler's
    proposal, as sorted JSON), and ``outcomes``, each one's state and value (rounded to 6 digits)."""
    trials = sorted(study.trials, key=lambda t: t.number)
    return {
        "proposals": [json.dumps(t.params, sort_keys=True, default=str) for t in trials],
        "outcomes": [[t.state.name, None if t.value is None else round(t.value, 6)] for t in trials],
    }


def read_study(run: Run, folder: Path) -> dict[str, Any]:
    """What the benchmark reports of one study and its final, read from its MLflow parent run and Optuna journal."""
    parent = parent_run(folder, run.name)
    metrics = parent.data.metrics
    study = optuna_study(folder, run.name)
    number, config, selection = optuna_pick(study)
    keys = test_metric_keys().items()
    tests = {key: metrics.get(metric) for key, metric in keys}
    spreads = {key: metrics.get(metric.removesuffix("_mean") + "_std") for key, metric in keys}
    joint = {key: metrics.get(metric.replace("final_", "final_ensemble_", 1).removesuffix("_mean")) for key, metric in keys}
    return {
        "study": run.name, "seed": run.seed, "repeat": run.repeat, "wall_time_s": metrics.get("wall_time_s"),
        "utilization": metrics.get("utilization"), "n_complete": metrics.get("n_complete"), "n_pruned": metrics.get("n_pruned"),
        "confirmation_runs": metrics.get("confirmation_runs"), "picked_trial": number, "config": config,
        "pick_mean": metrics.get(f"pick_mean_{parent.data.params.get('metric', 'val_recall_at_1')}"), "selection": selection,
        "test": tests, "test_std": spreads, "ensemble_test": joint, "final_time_per_seed_s": metrics.get("final_time_per_seed_s_mean"),
        **trial_sequence(study),
    }  # fmt: skip


def with_words(result: dict[str, Any]) -> dict[str, Any]:
    """A study's result with what the table and the summary say of its pick, derived from its config and selection
    record (again on every invocation, so a kept result reads as a new one would)."""
    config, selection = result["config"], result["selection"]
    return {
        **result, "family": family(config), "params": key_params(config), "config_identity": config_identity(config),
        "verdict": short_verdict(selection), "clear": called_clear(selection),
    }  # fmt: skip


def set_aside(folder: Path) -> None:
    """Rename the folder of a study that stopped mid-way, so that it starts again in a fresh one (kept, not deleted)."""
    aside = folder.with_name(f"{folder.name}.interrupted-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    folder.rename(aside)
    print(f"study {folder.name} stopped before its end in an earlier run: its folder is now {aside}; it starts again", flush=True)


def step(name: str, command: list[str], folder: Path, env: dict[str, str], cwd: Path) -> dict[str, float]:
    """Run one command of a study (``launch`` or ``final``) unless an earlier invocation finished it: its wall seconds and
    the machine's load average before and after, kept in ``folder``/NAME.done.json.

    The bench's own mark, not the study's MLflow records: MLflow keeps a sqlite store open per URI, and a store read
    before its folder is set aside would be read again in place of the new one.
    """
    done = folder / f"{name}.done.json"
    if done.is_file():
        return json.loads(done.read_text())
    before = os.getloadavg()[0]
    seconds = run_logged(command, env, folder / f"{name}.log", cwd)
    record = {"seconds": seconds, "load_before": before, "load_after": os.getloadavg()[0]}
    done.write_text(json.dumps(record))
    return record


def bench_study(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """Run study ``run`` and its final unless an earlier invocation did; its result, also written to its folder."""
    folder = args.keep / run.name
    result_file = folder / RESULT_FILE
    if result_file.is_file():
        print(f"kept: {run.name} (its results: {result_file})", flush=True)
        kept = json.loads(result_file.read_text())
        if "proposals" not in kept:  # kept by a version of the bench that did not read them
            kept.update(trial_sequence(optuna_study(folder, run.name)))
        return with_words(kept)
    if folder.exists() and not (folder / "launch.done.json").is_file():
        set_aside(folder)
    folder.mkdir(parents=True, exist_ok=True)
    env, commands = study_env(folder, args.data_root), {"launch": launch_command(run, args), "final": final_command(run, args)}
    commit = harness.commit(args.checkout)  # the code the study starts with (the clone may change while it runs)
    steps = {name: step(name, command, folder, env, args.checkout) for name, command in commands.items()}
    result = {**read_study(run, folder), **steps, "final_seeds": args.final_seeds, "commit": commit}
    result["commands"] = [shlex.join(c) for c in commands.values()]
    result_file.write_text(json.dumps(result, indent=1, default=str))
    return with_words(result)


def summarize(results: list[dict[str, Any]], repeat_seed: int) -> dict[str, Any]:
    """Over the first run of every sampler seed: the mean and spread of the picks' test metrics, the families that
    won; over the runs of ``repeat_seed``: the reproducibility judgement."""
    firsts = [r for r in results if r["repeat"] == 1]
    repeats = [r for r in results if r["seed"] == repeat_seed]
    first = repeats[0] if repeats else {}
    return {
        "seeds": [r["seed"] for r in firsts],
        "test": {key: spread_and_mean([r["test"][key] for r in firsts]) for key in TESTS},
        "ensemble_test": {key: spread_and_mean([r.get("ensemble_test", {}).get(key) for r in firsts]) for key in TESTS},
        "wall_time_s": spread_and_mean([r["wall_time_s"] for r in firsts]),
        "families": family_counts([r["family"] for r in firsts]),
        "repeats": {
            "seed": repeat_seed, "studies": [r["study"] for r in repeats],
            **reproducibility([(r["config_identity"], r["clear"]) for r in repeats]),
            "same_first_proposals": [leading_same(first.get("proposals", []), r.get("proposals", [])) for r in repeats[1:]],
            "same_first_outcomes": [leading_same(first.get("outcomes", []), r.get("outcomes", [])) for r in repeats[1:]],
            "trials": [len(r.get("proposals", [])) for r in repeats],
        },
    }  # fmt: skip


def cell(value: float | None, digits: int = 3, std: float | None = None) -> str:
    """A table cell: the value (and +- std), '-' when not measured."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}" + (f" +- {std:.{digits}f}" if std is not None and math.isfinite(std) else "")


def table(results: list[dict[str, Any]]) -> list[str]:
    """One row per study: its times, pick, verdict and the pick's test metrics (mean +- std over the final's seeds; the
    mean alone for one seed)."""
    lines = [
        "| study | sampler seed | wall s | utilization | pick | family | verdict | test R@1 | test MAP@R | 20-way one-shot error "
        "| final s per seed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tests = [cell(r["test"][key], 3, r["test_std"][key] if r.get("final_seeds", 0) > 1 else None) for key in TESTS]
        lines.append(
            f"| {r['study']} | {r['seed']} | {cell(r['wall_time_s'], 0)} | {cell(r['utilization'], 2)} | "
            f"#{r['picked_trial']}: {r['params']} | {r['family']} | {r['verdict']} | {' | '.join(tests)} | "
            f"{cell(r['final_time_per_seed_s'], 0)} |"
        )
    return lines


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary in sentences: mean and spread per test metric, the winning families, the repeats' judgement."""
    names = {"recall_at_1": "test R@1", "map_at_r": "test MAP@R", "one_shot_error": "20-way one-shot error"}
    lines = [f"Over sampler seeds {', '.join(map(str, summary['seeds']))} (the first run of each):", ""]
    for key, name in names.items():
        s = summary["test"][key]
        lines.append(
            f"- {name}: mean {cell(s['mean'], 4)}, spread {cell(s['spread'], 4)} (min {cell(s['min'], 4)}, max {cell(s['max'], 4)})"
        )
        joint = summary.get("ensemble_test", {}).get(key, {"n": 0})
        if joint["n"]:
            lines.append(
                f"  - the final model (its seeds, or after an undecided race the race's tie, as one model): "
                f"mean {cell(joint['mean'], 4)}, spread {cell(joint['spread'], 4)} "
                f"(min {cell(joint['min'], 4)}, max {cell(joint['max'], 4)})"
            )
    wall, fam = summary["wall_time_s"], summary["families"]
    lines.append(f"- study wall time: mean {cell(wall['mean'], 0)} s (min {cell(wall['min'], 0)}, max {cell(wall['max'], 0)})")
    counts = ", ".join(f"{f} {n}" for f, n in fam["counts"].items())
    lines.append(f"- winning family: {' / '.join(fam['most'])} in {fam['wins']} of {fam['of']} ({counts})")
    rep = summary["repeats"]
    if rep["judgement"] is None:
        lines.append(f"- repeats of sampler seed {rep['seed']}: {rep['runs']} run(s), nothing to compare")
    else:
        meaning = {SAME: "every run picked it", TIE: "the picks differ and no race called its pick clear",
                   CONTRADICTION: "a race called its pick clear and another run picked another configuration"}  # fmt: skip
        lines.append(
            f"- repeats of sampler seed {rep['seed']} ({', '.join(rep['studies'])}): {rep['judgement']}: {meaning[rep['judgement']]} "
            f"({rep['distinct']} distinct configuration(s) in {rep['runs']} runs)"
        )
        for study, proposed, ended in zip(rep["studies"][1:], rep.get("same_first_proposals", []), rep.get("same_first_outcomes", [])):
            lines.append(
                f"  - {study} proposed the same first {proposed} trials as {rep['studies'][0]} (of {rep['trials'][0]}), "
                f"and the first {ended} ended alike (state and value)"
            )
    return lines


def markdown(payload: dict[str, Any]) -> str:
    machine = payload["machine"]
    lines = [
        "## Verdicts across sampler seeds (python -m bench.verdicts)",
        "",
        f"Command: `{payload['command']}`  ",
        f"Commit of the studies: {payload['commits']}; table of {payload['date']}; {machine['cpu']} ({machine['cores']} cores); "
        f"study.launch flags beyond the default: `{shlex.join(payload['extra']) or 'none'}`; "
        f"study.final with {payload['final_seeds']} seed(s)"
        + (f" of {payload['final_epochs']} epochs" if payload["final_epochs"] else "")
        + ".",
        "",
        *table(payload["results"]),
        "",
        "Test metrics: mean +- sample standard deviation over study.final's seeds. Verdict: the race's (study.search.race), "
        "why it stopped and after how many validation folds.",
        "",
        *summary_lines(payload["summary"]),
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser("verdicts", __doc__)
    a = parser.add_argument
    a("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="sampler seeds, one study each (default 0 1 2 3 4)")
    a("--repeats", type=int, default=3, help="runs in all of --repeat-seed, to measure reproducibility; its study among --seeds counts as "
      "the first (default 3; 0 or 1: none more)")  # fmt: skip
    a("--repeat-seed", type=int, default=0, help="the sampler seed that is run --repeats times (default 0)")
    a(
        "--data-root",
        default=os.environ.get("DML_DATA_ROOT"),
        help="folder holding omniglot/ (default: $DML_DATA_ROOT, e.g. ../shared/data)",
    )
    a("--extra", default="", help="more study.launch flags, one string, e.g. \"--num-samples 4 --epochs 4\" for a quick check "
      "(a single flag without a value: --extra=--no-reuse-actors); not --seed or --study-name")  # fmt: skip
    a("--final-seeds", type=int, default=3, help="seeds of study.final for each pick (default 3)")
    a("--final-epochs", type=int, default=None, help="study.final --epochs (default: the study's own final budget, 2 x its epochs)")
    a("--keep", default=str(ROOT / "runs" / PREFIX), help="folder of the studies' runs folders, one per study (default runs/verdicts); "
      "an invocation with the same --keep skips the studies that have results there")  # fmt: skip
    a("--checkout", default=str(ROOT), help="the clone whose study.launch and study.final run (its .venv's python when it has one), "
      "e.g. a git worktree at an earlier commit for a before / after table (default: this one)")  # fmt: skip
    a("--out", default=str(ROOT / "docs" / "bench" / "verdicts.json"), help="the JSON of every result and the summary")
    a("--markdown", default=str(ROOT / "docs" / "bench" / "verdicts.md"), help="the table's file ('-': print it only)")
    args = parser.parse_args(argv)
    args.extra = shlex.split(args.extra)
    if {"--seed", "--study-name", "--resume"} & {flag.split("=")[0] for flag in args.extra}:
        parser.error("--extra: the benchmark sets --seed and --study-name of each study itself and never resumes one")
    args.keep, args.checkout = Path(args.keep).expanduser().resolve(), Path(args.checkout).expanduser().resolve()
    args.data_root = str(Path(args.data_root).expanduser().resolve()) if args.data_root else None
    return args


def payload_of(args: argparse.Namespace, argv: list[str] | None, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything the benchmark writes: how it ran, on what, every study's result and the summary."""
    commits = ", ".join(dict.fromkeys(str(r.get("commit")) for r in results))
    return {
        "command": harness.command("verdicts", argv if argv is not None else sys.argv[1:]), "commits": commits,
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "machine": harness.machine(),
        "extra": args.extra, "final_seeds": args.final_seeds, "final_epochs": args.final_epochs, "results": results,
        "summary": summarize(results, args.repeat_seed),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data_root:
        print("error: no data root: pass --data-root (the folder holding omniglot/) or set DML_DATA_ROOT", file=sys.stderr)
        return 2
    runs = plan_runs(args.seeds, args.repeats, args.repeat_seed)
    print(f"{len(runs)} studies, one at a time, each with its final: {', '.join(r.name for r in runs)}", flush=True)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C, also where started in the background
        signal.signal(signum, signal.default_int_handler)
    try:
        results = [bench_study(run, args) for run in runs]  # one after another: never two studies on the machine at once
    except KeyboardInterrupt:
        print("stopped: run the same command again to continue (finished studies are kept; an unfinished one starts again)")
        return 130
    payload = payload_of(args, argv, results)
    harness.write(args.out, json.dumps(payload, indent=1, default=str))
    text = markdown(payload)
    if args.markdown != "-":
        harness.write(args.markdown, text)
    print(text)
    return bound(payload["summary"])


def bound(summary: dict[str, Any]) -> int:
    """Issue 31's targets on the final models (the seeds or the race's tie as one model, where study.final made one)."""
    final = summary["ensemble_test"] if summary["ensemble_test"]["recall_at_1"]["n"] else summary["test"]
    r1, error, judgement = final["recall_at_1"], final["one_shot_error"], summary["repeats"]["judgement"]
    if r1["mean"] is None or error["mean"] is None:
        return harness.bound(None, "issue 31's targets: no final model's test metrics were recorded")
    held = r1["mean"] >= 0.86 and r1["spread"] <= 0.015 and error["mean"] <= 0.22 and judgement != CONTRADICTION
    statement = (f"test R@1 mean >= 0.86 ({r1['mean']:.3f}), spread <= 1.5 points ({100 * r1['spread']:.1f}), one-shot error "
                 f"<= 22 % ({error['mean']:.1%}), the repeats not a {CONTRADICTION} ({judgement or 'one run'})")  # fmt: skip
    return harness.bound(held, statement)


if __name__ == "__main__":
    sys.exit(main())
