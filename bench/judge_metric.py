"""Which validation metric should judge: do val R@1 and val MAP@R order trained models as the unseen test classes do?

Issue 31, step 3. The verdict benchmark (bench/verdicts.py) compares studies judged by one metric or the other through
their picks alone: 5 numbers a side. This bench asks the same question of every model those studies trained. It reads
the trial checkpoints a study leaves in its runs folder (``ray/<study>/<trial>/checkpoint_*``, Tune keeps the last 2
of each trial), restores each trial's latest model, and scores it twice:

* on the validation classes the trial itself held out (its config's ``val_split``, ``val_fraction`` and ``val_fold``:
  a confirmation re-run's fold is its own), as the study judged it: R@1 and MAP@R;
* on the test classes, as study.final reports a final model: R@1, MAP@R and the 20-way one-shot error.

The recomputed validation score is checked against the one the trial reported at the same budget and epoch (its Tune
``result.json``): a restored model that scores otherwise is reported, not used.

Reported over two groups: the trials that completed their study's full budget (the candidates a race and a pick choose
among) whose last checkpoint is at most ``--near-end`` epochs before the end (a study checkpoints at most every 60 s,
so a trial's last checkpoint may be several epochs before its end), and every restored model, whatever its epoch:

* the Spearman rank correlation of each validation score (R@1, MAP@R, and their sum) with each test score;
* pairwise agreement: of the pairs of models within one study whose test R@1 differs by more than ``--margin``, the
  share that each validation score orders the same way;
* per study, the full-budget search trial each validation score would pick, and its test R@1 against the best one's.

  python bench/judge_metric.py --data-root ../shared/data RUNS [RUNS ...]     # each RUNS: a study's runs folder

Results: docs/bench/judge_metric.{json,md} (``--out``, ``--markdown``). One process, one thread: it can run beside
a study (evaluating a small model on a few thousand images is seconds of CPU).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from scipy.stats import binomtest, spearmanr  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainables.core.config import TrainConfig  # noqa: E402
from trainables.core.data import dataset_label, image_size_for, validation_split  # noqa: E402
from trainables.core.engine import ONE_SHOT_WAYS, build_model, evaluate  # noqa: E402
from trainables.dml import load_state, worker_dataset  # noqa: E402

VAL = ("val_recall_at_1", "val_map_at_r")
TEST = ("test_recall_at_1", "test_map_at_r", f"test_one_shot_error_{ONE_SHOT_WAYS}way")
JUDGES = {"val R@1": ("val_recall_at_1",), "val MAP@R": ("val_map_at_r",), "val R@1 + MAP@R": VAL}


@dataclass(frozen=True)
class Model:
    study: str  # the study's folder under the runs folder's ray/
    trial: str  # Tune's trial id
    rerun: bool  # a confirmation re-run (a fold other than the trial's)
    loss: str
    normalization: str
    budget: int
    epoch: int
    full: bool  # the trial completed the full budget (a candidate) and its last checkpoint is near its end
    scores: dict[str, float]
    reported: float  # the val R@1 the trial reported at this budget and epoch (nan: none found)


def latest_checkpoints(runs: Path) -> list[Path]:
    """The newest checkpoint of each trial under ``runs``/ray/<study>/."""
    found = []
    for trial in sorted(runs.glob("ray/*/train_trial_*")):
        checkpoints = sorted(trial.glob("checkpoint_*"))
        if checkpoints:
            found.append(checkpoints[-1])
    return found


def reported(trial: Path, budget: int, epoch: int) -> tuple[float, int]:
    """The val R@1 the trial reported at ``budget`` and ``epoch`` (nan if none), and the last budget it completed
    (its result.json)."""
    value, completed = float("nan"), 0
    for line in (trial / "result.json").read_text().splitlines():
        row = json.loads(line)
        if row.get("budget") == budget and row.get("epoch") == epoch:
            value = float(row.get("val_recall_at_1", "nan"))
        completed = max(completed, int(row.get("completed_budget", 0)))
    return value, completed


def score(checkpoint: Path, data_root: str, near_end: int) -> Model:
    """Restore the checkpoint's model and score it on its validation fold and on the test classes."""
    state = load_state(checkpoint)
    bundle = state.bundle
    config = TrainConfig.from_dict(bundle["config"], source=str(checkpoint))
    splits = worker_dataset(config.dataset, data_root, config.image_size)  # decoded once for all the checkpoints
    image_size = image_size_for(config.dataset, config.image_size)
    model = build_model(config, bundle["kind"], image_size)
    model.load_state_dict(bundle["model"])
    device = torch.device("cpu")
    where = dataset_label(config.dataset, data_root)
    _, val_classes = validation_split(splits.train, config.val_split, config.val_fraction, where, config.val_fold)
    common = {"ks": splits.recall_ks, "seed": config.seed}
    val, _ = evaluate(model, splits.train.with_classes(val_classes), image_size, device, prefix="val", **common)
    test, _ = evaluate(model, splits.test, image_size, device, prefix="test", gallery=splits.gallery, one_shot_ways=ONE_SHOT_WAYS, **common)
    epoch = int(bundle["epoch"])
    val_reported, completed = reported(checkpoint.parent, state.budget, epoch)
    params = json.loads((checkpoint.parent / "params.json").read_text())  # the trial's Tune config: the study's budget
    rerun, full_budget = params.get("confirms_trial") is not None, int(params["epochs"])
    return Model(
        study=checkpoint.parents[1].name,
        trial=checkpoint.parent.name.split("_")[2],
        rerun=rerun,
        loss=config.loss,
        normalization=config.normalization,
        budget=state.budget,
        epoch=epoch,
        full=completed == state.budget == full_budget and epoch >= full_budget - near_end,
        scores={k: float(v) for k, v in {**val, **test}.items() if k in VAL + TEST},
        reported=val_reported,
    )


def judge_value(model: Model, judge: str) -> float:
    return sum(model.scores[k] for k in JUDGES[judge])


def correlations(models: list[Model]) -> dict[str, dict[str, float]]:
    """Spearman's rho of each judge with each test score (the one-shot error negated: higher is better)."""
    out = {}
    for judge in JUDGES:
        x = [judge_value(m, judge) for m in models]
        row = {}
        for test in TEST:
            y = [m.scores[test] * (-1 if "error" in test else 1) for m in models]
            row[test] = float(spearmanr(x, y).statistic) if len(models) > 2 else float("nan")
        out[judge] = row
    return out


def pair_agreement(models: list[Model], margin: float) -> dict[str, Any]:
    """(agreeing, counted) pairs within a study whose test R@1 differs by more than ``margin``, per judge; and the
    pairs val R@1 alone orders right against those val MAP@R alone does, with McNemar's exact two-sided p (a
    binomial test on those discordant pairs; the pairs share models, so it is a guide, not an exact level)."""
    counts = {judge: [0, 0] for judge in JUDGES}
    only = {"val R@1": 0, "val MAP@R": 0}
    for a, b in itertools.combinations(models, 2):
        gap = a.scores["test_recall_at_1"] - b.scores["test_recall_at_1"]
        if a.study != b.study or abs(gap) <= margin:
            continue
        right = {judge: (judge_value(a, judge) - judge_value(b, judge)) * gap > 0 for judge in JUDGES}
        for judge in JUDGES:
            counts[judge][1] += 1
            counts[judge][0] += right[judge]
        if right["val R@1"] != right["val MAP@R"]:
            only["val R@1" if right["val R@1"] else "val MAP@R"] += 1
    discordant = sum(only.values())
    p = binomtest(only["val R@1"], discordant).pvalue if discordant else float("nan")
    return {"agree": {judge: tuple(c) for judge, c in counts.items()}, "only": only, "mcnemar_p": p}


def picks(models: list[Model]) -> dict[str, dict[str, float | str]]:
    """Per study: the full-budget search trial each judge ranks first, its test R@1, and the best test R@1 there."""
    out = {}
    for study in sorted({m.study for m in models}):
        pool = [m for m in models if m.study == study and m.full and not m.rerun]
        if not pool:
            continue
        row: dict[str, float | str] = {"candidates": len(pool), "best test R@1": max(m.scores["test_recall_at_1"] for m in pool)}
        for judge in JUDGES:
            chosen = max(pool, key=lambda m, judge=judge: judge_value(m, judge))
            row[judge] = chosen.scores["test_recall_at_1"]
            row[f"{judge} trial"] = chosen.trial
        out[study] = row
    return out


def families(models: list[Model]) -> dict[str, dict[str, float]]:
    """The candidates' mean scores per loss and normalization: how far apart validation and the test put them."""
    out = {}
    for loss, norm in sorted({(m.loss, m.normalization) for m in models}):
        group = [m for m in models if (m.loss, m.normalization) == (loss, norm)]
        out[f"{loss}, {norm}"] = {"n": len(group), **{k: sum(m.scores[k] for m in group) / len(group) for k in VAL + TEST}}
    return out


def markdown(result: dict) -> str:
    epochs = [m["epoch"] for m in result["each"] if m["full"]]
    lines = [f"Models: {result['models']} restored, {result['full']} of trials that completed the full budget (at epochs "
             f"{min(epochs, default=0)} to {max(epochs, default=0)}), from {', '.join(result['studies'])}.", ""]  # fmt: skip
    for group in ("full budget", "every model"):
        lines += [f"Spearman's rho with the test scores, {group} (n = {result['n'][group]}; one-shot error negated):", ""]
        lines += ["| judge | test R@1 | test MAP@R | test one-shot |", "|---|---:|---:|---:|"]
        for judge, row in result["spearman"][group].items():
            lines.append(f"| {judge} | " + " | ".join(f"{row[t]:.2f}" for t in TEST) + " |")
        agree, pairs = result["pairs"][group]["agree"], result["pairs"][group]
        margin = result["margin"]
        lines += ["", f"Pairs within a study whose test R@1 differs by more than {margin:.3f}, ordered as the test orders them:", ""]
        lines += ["| judge | agreeing pairs |", "|---|---:|"]
        lines += [f"| {judge} | {a} of {n} ({a / n:.0%}) |" if n else f"| {judge} | none |" for judge, (a, n) in agree.items()]
        lines += ["", f"Ordered right by val R@1 alone: {pairs['only']['val R@1']}; by val MAP@R alone: {pairs['only']['val MAP@R']} "
                  f"(McNemar's exact p {pairs['mcnemar_p']:.2f})."]  # fmt: skip
        lines.append("")
    lines += ["The candidates' mean scores by loss and feature normalization (full-budget search trials):", ""]
    lines += ["| loss, normalization | trials | val R@1 | val MAP@R | test R@1 | test MAP@R | test one-shot error |", "|---|" + "---:|" * 6]
    for name, row in result["families"].items():
        lines.append(f"| {name} | {row['n']} | " + " | ".join(f"{row[k]:.3f}" for k in VAL + TEST) + " |")
    lines += ["", "Per study, the full-budget search trial each judge ranks first (test R@1):", ""]
    lines += ["| study | candidates | best | " + " | ".join(JUDGES) + " |", "|---|---:|---:|" + "---:|" * len(JUDGES)]
    for study, row in result["picks"].items():
        chosen = " | ".join(f"{row[j]:.3f} ({row[j + ' trial']})" for j in JUDGES)
        lines.append(f"| {study} | {row['candidates']} | {row['best test R@1']:.3f} | {chosen} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="runs folders of finished studies (DML_RUNS_DIR), one study each")
    p.add_argument("--data-root", default=os.environ.get("DML_DATA_ROOT", str(ROOT.parent / "shared" / "data")))
    p.add_argument("--margin", type=float, default=0.01, help="pairs closer than this in test R@1 are not counted (default 0.01)")
    p.add_argument("--near-end", type=int, default=2, help="epochs a candidate's last checkpoint may be before its end")
    p.add_argument("--tolerance", type=float, default=0.005, help="how far a recomputed val R@1 may be from the reported one")
    p.add_argument("--out", default=str(ROOT / "docs" / "bench" / "judge_metric.json"))
    p.add_argument("--markdown", default=str(ROOT / "docs" / "bench" / "judge_metric.md"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    models, mismatched = [], []
    for runs in map(Path, args.runs):
        for checkpoint in latest_checkpoints(runs):
            model = score(checkpoint, args.data_root, args.near_end)
            if abs(model.scores["val_recall_at_1"] - model.reported) > args.tolerance:  # nan (no report) fails as well
                recomputed = model.scores["val_recall_at_1"]
                mismatched.append({"checkpoint": str(checkpoint), "recomputed": recomputed, "reported": model.reported})
                continue
            models.append(model)
            print(f"{model.study} {model.trial} {model.loss}/{model.normalization} budget {model.budget} epoch {model.epoch}: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in model.scores.items()), flush=True)  # fmt: skip
    groups = {"full budget": [m for m in models if m.full], "every model": models}
    result = {
        "studies": sorted({m.study for m in models}),
        "host": platform.processor() or platform.machine(),
        "models": len(models),
        "full": len(groups["full budget"]),
        "margin": args.margin,
        "mismatched": mismatched,
        "n": {g: len(ms) for g, ms in groups.items()},
        "spearman": {g: correlations(ms) for g, ms in groups.items()},
        "pairs": {g: pair_agreement(ms, args.margin) for g, ms in groups.items()},
        "picks": picks(models),
        "families": families([m for m in groups["full budget"] if not m.rerun]),
        "each": [asdict(m) for m in models],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    if args.markdown != "-":
        Path(args.markdown).write_text(text)
    print(text + (f"{len(mismatched)} checkpoints left out: their val R@1 differs from the reported one\n" if mismatched else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
