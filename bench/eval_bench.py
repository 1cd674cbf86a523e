"""Wall time and peak memory of the evaluation metrics at retrieval-benchmark scale.

Workload: synthetic clustered unit-norm embeddings of shape N x D with C classes (class centre plus gaussian noise,
the noise bisected until Recall@1 of 2,000 queries is about 0.65), by default the CUB test split's 8,131 x 64 x 98
and the SOP test split's 60,502 x 512 x 11,316, evaluated by:

* ``project``: ``trainables.core.metrics.evaluate_embeddings`` with ks = (1, 10, 100) as ``engine.evaluate`` calls it
  (Recall@1/10/100, MAP@R, R-precision, NMI from one k-means++-seeded k-means run, ``nmi_runs`` = 1);
* ``project_nmi3``: the same with ``nmi_runs=3``, for reference;
* ``lower_bound``: one exact ``faiss.IndexFlatIP`` search with k = 101 on all N plus one ``faiss.Kmeans`` with k = C
  and faiss's defaults, nothing else (the two parts timed apart and summed);
* ``pml``: pytorch-metric-learning's ``AccuracyCalculator`` (precision_at_1, mean_average_precision_at_r, NMI);
* ``sklearn``: scikit-learn's brute-force cosine ``NearestNeighbors`` with k = 101.

Each measurement is a fresh child process (``--one METHOD``) that warms the method up on 400 rows, loads the data and
runs it once: its wall time and its peak RSS over the RSS after loading; medians over ``--repeats`` children.

Question: does the project's evaluation cost what the metrics must cost, at the papers' test-set sizes?

Bound: at every ``--sizes`` shape, the project's evaluation takes at most 1.3x the lower bound's wall time and
under 1 GiB of peak memory.

    python -m bench.eval_bench --sizes 8131x64x98 60502x512x11316 --curve 8000,30000,60000,120000 \\
        --repeats 3 --out docs/bench/eval.json

writes the JSON, a Markdown fragment beside it (``.md``) and a table on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import harness

METHODS = ("project", "project_nmi3", "lower_bound", "pml", "sklearn")
KS = (1, 10, 100)
KNN_K = 101
WARMUP_ROWS = 400  # rows of the data each child runs its method on once before measuring
SOP_IMAGES_PER_CLASS = 5.35  # Stanford Online Products test split: 60,502 images of 11,316 products
CURVE_D = 512
TARGET_RECALL_AT_1 = 0.65
CALIBRATION_QUERIES = 2000
SEED = 0
TOLERANCE_RETRIEVAL = 1e-3  # exact kNN everywhere: differences come from near-ties in float32 only
TOLERANCE_NMI = 0.01  # k-means is randomized (seeds, initialization): NMI agrees within this
TARGET_TIME_RATIO = 1.3
TARGET_PEAK_MB = 1024.0

LABELS = {
    "project": "project evaluate_embeddings",
    "project_nmi3": "project evaluate_embeddings, nmi_runs=3 (not the default)",
    "lower_bound": "lower bound: faiss kNN + faiss k-means",
    "pml": "pytorch-metric-learning AccuracyCalculator",
    "sklearn": "scikit-learn NearestNeighbors brute cosine",
}


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        n, d, c = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be NxDxC with integers, got {text!r}") from None
    if min(n, d, c) < 1 or n < 2 * c or n <= KNN_K:
        raise argparse.ArgumentTypeError(f"shape {text!r}: need D, C >= 1, N >= 2 C (every class holds two items or more) and N > {KNN_K}")
    return n, d, c


def parse_curve(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--curve must be comma-separated integers, got {text!r}") from None
    if not values or min(values) <= KNN_K:
        raise argparse.ArgumentTypeError(f"--curve needs sizes > {KNN_K}, got {text!r}")
    return values


def curve_classes(n: int) -> int:
    return max(1, round(n / SOP_IMAGES_PER_CLASS))


def _top1_match(x: np.ndarray, y: np.ndarray, queries: np.ndarray) -> float:
    import faiss

    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, ids = index.search(x[queries], 2)
    first = np.where(ids[:, 0] == queries, ids[:, 1], ids[:, 0])
    return float((y[first] == y[queries]).mean())


def make_data(n: int, d: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Unit-norm embeddings: random unit class centres plus gaussian noise, renormalized.

    Class sizes are 2 + a multinomial share of the remaining N - 2C items (mean N / C), rows are
    shuffled. The noise scale s (x = centre + s * g / sqrt(D), g standard normal) is bisected on a
    log scale until Recall@1 of 2,000 random queries against all N is within 0.02 of 0.65.
    """
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((c, d), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    sizes = 2 + rng.multinomial(n - 2 * c, np.full(c, 1.0 / c))
    labels = rng.permutation(np.repeat(np.arange(c, dtype=np.int64), sizes))
    noise = rng.standard_normal((n, d), dtype=np.float32)
    noise /= np.float32(math.sqrt(d))
    queries = rng.choice(n, size=min(n, CALIBRATION_QUERIES), replace=False)

    def build(scale: float) -> np.ndarray:
        x = noise * np.float32(scale)
        x += centres[labels]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    lo, hi = math.log(0.05), math.log(20.0)  # recall falls as the noise grows
    scale, recall = 1.0, float("nan")
    for _ in range(14):
        scale = math.exp((lo + hi) / 2)
        x = build(scale)
        recall = _top1_match(x, labels, queries)
        if abs(recall - TARGET_RECALL_AT_1) <= 0.02:
            break
        if recall > TARGET_RECALL_AT_1:
            lo = math.log(scale)
        else:
            hi = math.log(scale)
        del x
    x = build(scale)
    return np.ascontiguousarray(x, dtype=np.float32), labels, {"noise_scale": scale, "calibration_recall_at_1": recall}


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_kb() -> int:
    hwm = _proc_status_kb("VmHWM")
    if hwm is not None:
        return hwm
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _nmi(labels: np.ndarray, assignment: np.ndarray) -> float:
    from sklearn.metrics import normalized_mutual_info_score

    return float(normalized_mutual_info_score(labels, assignment, average_method="arithmetic"))


def _first_other(ids: np.ndarray) -> np.ndarray:
    """Per row of a self-search result, the first neighbour that is not the query itself."""
    rows = np.arange(ids.shape[0])
    is_self = ids == rows[:, None]
    first_col = np.argmax(~is_self, axis=1)
    return ids[rows, first_col]


def _prepare(method: str) -> Any:
    """Import what ``method`` needs (before the memory baseline); return its runner."""
    if method in ("project", "project_nmi3"):
        import faiss
        import torch

        from trainables.core import metrics

        parts: dict[str, Any] = {}
        kwargs = {"nmi_runs": 3} if method == "project_nmi3" else {}

        def timed(name: str, fn: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0
                return out

            return wrapper

        # Time the parts evaluate_embeddings calls through module globals; count Lloyd iterations.
        metrics.retrieval_metrics = timed("retrieval_s", metrics.retrieval_metrics)
        metrics.nmi = timed("nmi_s", metrics.nmi)
        if hasattr(metrics, "_kmeans_plus_plus"):  # the k-means++ seeding, timed when present
            metrics._kmeans_plus_plus = timed("seeding_s", metrics._kmeans_plus_plus)
        train = faiss.Kmeans.train

        def train_counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = train(self, *args, **kwargs)
            parts["kmeans_iterations"].append(len(self.obj))
            return out

        faiss.Kmeans.train = train_counted

        def run(x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, float], dict[str, Any]]:
            parts.clear()
            parts.update(seeding_s=0.0, kmeans_iterations=[])
            t0 = time.perf_counter()
            out = metrics.evaluate_embeddings(torch.from_numpy(x), y, KS, **kwargs)
            return time.perf_counter() - t0, out, dict(parts)

        return run

    if method == "lower_bound":
        import faiss

        def run(x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, float], dict[str, Any]]:
            n, d = x.shape
            n_classes = int(np.unique(y).size)
            t0 = time.perf_counter()
            index = faiss.IndexFlatIP(d)
            index.add(x)
            _, ids = index.search(x, KNN_K)
            t1 = time.perf_counter()
            kmeans = faiss.Kmeans(d, n_classes)
            kmeans.train(x)
            t2 = time.perf_counter()
            # Not part of the bound: the assignment NMI needs, and the metric values.
            _, assignment = kmeans.index.search(x, 1)
            t3 = time.perf_counter()
            values = {"top1_label_match": float((y[_first_other(ids)] == y).mean()), "nmi": _nmi(y, assignment.ravel())}
            parts = {"knn_s": t1 - t0, "kmeans_s": t2 - t1, "assign_s_untimed": t3 - t2, "kmeans_iterations": [len(kmeans.obj)]}
            return t2 - t0, values, parts

        return run

    if method == "pml":
        import torch
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        def run(x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, float], dict[str, Any]]:
            t0 = time.perf_counter()
            calc = AccuracyCalculator(
                include=("precision_at_1", "mean_average_precision_at_r", "NMI"),
                k="max_bin_count",
                device=torch.device("cpu"),
            )
            out = calc.get_accuracy(torch.from_numpy(x), torch.from_numpy(y))
            return time.perf_counter() - t0, {k: float(v) for k, v in out.items()}, {}

        return run

    if method == "sklearn":
        from sklearn.neighbors import NearestNeighbors

        def run(x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, float], dict[str, Any]]:
            t0 = time.perf_counter()
            nn = NearestNeighbors(n_neighbors=KNN_K, metric="cosine", algorithm="brute").fit(x)
            _, ids = nn.kneighbors(x, n_neighbors=KNN_K)
            seconds = time.perf_counter() - t0
            return seconds, {"top1_label_match": float((y[_first_other(ids)] == y).mean())}, {}

        return run

    raise ValueError(f"unknown method {method!r}")


def child_main(method: str, data_dir: Path, result: Path) -> None:
    run = _prepare(method)
    # One call on a few hundred points first: thread pools, BLAS buffers and lazy imports are
    # set up before the memory baseline and outside the timing.
    x = np.load(data_dir / "x.npy", mmap_mode="r")
    warm_x = np.ascontiguousarray(x[: min(WARMUP_ROWS, x.shape[0])])
    run(warm_x, np.arange(warm_x.shape[0]) % max(2, warm_x.shape[0] // 8))
    del x, warm_x
    x = np.load(data_dir / "x.npy")
    y = np.load(data_dir / "y.npy")
    gc.collect()
    reset = _reset_peak_rss()
    baseline_kb = _proc_status_kb("VmRSS") or 0
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    seconds, values, parts = run(x, y)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    peak_kb = _peak_rss_kb()
    out = {
        "method": method,
        "seconds": seconds,
        "cpu_seconds": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
        "peak_mb": max(peak_kb - baseline_kb, 0) / 1024.0,
        "peak_rss_mb": peak_kb / 1024.0,
        "baseline_rss_mb": baseline_kb / 1024.0,
        "peak_counter_reset": reset,
        "metrics": values,
        "parts": parts,
    }
    result.write_text(json.dumps(out))


def run_child(method: str, data_dir: Path) -> dict[str, Any]:
    """Run ``method`` once in a fresh child process; its measurement."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    try:
        cmd = [sys.executable, "-m", "bench.eval_bench", "--one", method, "--data", str(data_dir), "--result", str(result)]
        proc = subprocess.run(cmd, cwd=harness.ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{method} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)


def summarize(method: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, minima and maxima over the children of one method."""

    def stats(values: list[float]) -> dict[str, Any]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}

    out: dict[str, Any] = {
        "label": LABELS[method],
        "seconds": stats([r["seconds"] for r in runs]),
        "cpu_seconds": stats([r["cpu_seconds"] for r in runs]),
        "peak_mb": stats([r["peak_mb"] for r in runs]),
        "peak_rss_mb": stats([r["peak_rss_mb"] for r in runs]),
        "baseline_rss_mb": statistics.median(r["baseline_rss_mb"] for r in runs),
        "peak_counter_reset": all(r["peak_counter_reset"] for r in runs),
        "metrics": runs[0]["metrics"],
        "metrics_all_runs": [r["metrics"] for r in runs],
    }
    part_names = [k for k, v in runs[0]["parts"].items() if isinstance(v, float)]
    if part_names:
        out["parts_seconds"] = {k: stats([r["parts"][k] for r in runs]) for k in part_names}
    if "kmeans_iterations" in runs[0]["parts"]:
        out["kmeans_iterations"] = [r["parts"]["kmeans_iterations"] for r in runs]
    return out


def write_data(n: int, d: int, c: int, seed: int, root: Path) -> tuple[Path, dict[str, float]]:
    data_dir = root / f"{n}x{d}x{c}"
    data_dir.mkdir(parents=True, exist_ok=True)
    x, y, info = make_data(n, d, c, seed)
    np.save(data_dir / "x.npy", x)
    np.save(data_dir / "y.npy", y)
    info["max_class_size"] = int(np.bincount(y).max())
    del x, y
    gc.collect()
    return data_dir, info


# the figures compared across methods: (method, the metric it reports, the name it is shown under), in table order
COMPARED = {
    "recall_at_1": (("project", "recall_at_1", "project recall_at_1"), ("pml", "precision_at_1", "pml precision_at_1"),
                    ("lower_bound", "top1_label_match", "faiss top-1 label match"),
                    ("sklearn", "top1_label_match", "sklearn top-1 label match")),
    "map_at_r": (("project", "map_at_r", "project map_at_r"), ("pml", "mean_average_precision_at_r", "pml mean_average_precision_at_r")),
    "nmi": (("project", "nmi", "project nmi"), ("project_nmi3", "nmi", "project nmi (nmi_runs=3)"), ("pml", "NMI", "pml NMI"),
            ("lower_bound", "nmi", "faiss k-means NMI")),
}  # fmt: skip


def agreement(results: dict[str, Any]) -> dict[str, Any]:
    """Metric values of the methods side by side, with differences and tolerance checks."""
    out = {}
    for figure, sources in COMPARED.items():
        values = {shown: results[method]["metrics"][key] for method, key, shown in sources if method in results}
        spread = max(values.values()) - min(values.values()) if values else 0.0
        tolerance = TOLERANCE_NMI if figure == "nmi" else TOLERANCE_RETRIEVAL
        out[figure] = {"values": values, "max_abs_difference": spread, "tolerance": tolerance, "agree": spread <= tolerance}
    return out


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    if "lower_bound" not in results:
        return {}
    lb = results["lower_bound"]
    lb_s, lb_mb = lb["seconds"]["median"], lb["peak_mb"]["median"]
    out: dict[str, Any] = {}
    for name, res in results.items():
        if name == "lower_bound":
            continue
        out[f"{name}_over_lower_bound_time"] = res["seconds"]["median"] / lb_s
        out[f"{name}_over_lower_bound_peak"] = res["peak_mb"]["median"] / lb_mb if lb_mb > 0 else None
    for name in ("project", "project_nmi3"):
        if name in results:
            p = results[name]
            out[f"{name}_meets_target"] = {
                "time_ratio_max": TARGET_TIME_RATIO,
                "peak_mb_max": TARGET_PEAK_MB,
                "time_ok": p["seconds"]["median"] <= TARGET_TIME_RATIO * lb_s,
                "peak_ok": p["peak_mb"]["median"] < TARGET_PEAK_MB,
            }
    return out


def run_shape(n: int, d: int, c: int, methods: tuple[str, ...], repeats: int, root: Path, log: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    data_dir, info = write_data(n, d, c, SEED, root)
    log(f"  data {n}x{d}x{c}: noise scale {info['noise_scale']:.3f}, Recall@1 on 2,000 queries {info['calibration_recall_at_1']:.3f}")
    # Methods take turns within each repeat, so a change in the machine's load over the run
    # spreads over all of them instead of falling on one.
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for rep in range(repeats):
        for method in methods:
            r = run_child(method, data_dir)
            runs[method].append(r)
            log(f"  [{rep + 1}/{repeats}] {method:<12} {r['seconds']:9.2f} s  {r['peak_mb']:9.1f} MB")
    shutil.rmtree(data_dir, ignore_errors=True)
    results = {m: summarize(m, runs[m]) for m in methods}
    return {
        "shape": {"n": n, "d": d, "classes": c},
        "data": info,
        "methods": results,
        "ratios": ratios(results),
        "agreement": agreement(results),
        "wall_s_including_generation": time.perf_counter() - t0,
    }


def machine_info() -> dict[str, Any]:
    """The machine (bench.harness), its memory, the libraries' versions and their thread counts."""
    import faiss
    import sklearn
    import torch

    try:
        import pytorch_metric_learning

        pml_version = pytorch_metric_learning.__version__
    except ImportError:
        pml_version = None
    with open("/proc/meminfo") as f:
        mem_gb = int(f.readline().split()[1]) / 2**20
    return {
        **harness.machine(),
        "memory_gb": mem_gb,
        "load_average_at_start": harness.load(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "faiss": faiss.__version__,
        "sklearn": sklearn.__version__,
        "pytorch_metric_learning": pml_version,
        "threads": {
            "faiss_omp": faiss.omp_get_max_threads(),
            "torch": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
    }


def _fmt_s(stat: dict[str, float]) -> str:
    return f"{stat['median']:.2f} ({stat['min']:.2f}-{stat['max']:.2f})"


def _metric_cell(name: str, values: dict[str, float]) -> tuple[str, str, str]:
    if name in ("project", "project_nmi3"):
        return f"{values['recall_at_1']:.4f}", f"{values['map_at_r']:.4f}", f"{values['nmi']:.4f}"
    if name == "pml":
        return f"{values['precision_at_1']:.4f}", f"{values['mean_average_precision_at_r']:.4f}", f"{values['NMI']:.4f}"
    if name == "lower_bound":
        return f"{values['top1_label_match']:.4f}", "", f"{values['nmi']:.4f}"
    return f"{values['top1_label_match']:.4f}", "", ""


def shape_table(entry: dict[str, Any]) -> list[str]:
    s = entry["shape"]
    lines = [
        f"#### N = {s['n']:,}, D = {s['d']}, C = {s['classes']:,}",
        "",
        f"Noise scale {entry['data']['noise_scale']:.3f}; largest class {entry['data']['max_class_size']}.",
        "",
        "| method | seconds, median (min-max) | CPU seconds | peak MB | Recall@1 | MAP@R | NMI |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, res in entry["methods"].items():
        r1, mapr, nmi = _metric_cell(name, res["metrics"])
        lines.append(
            f"| {res['label']} | {_fmt_s(res['seconds'])} | {res['cpu_seconds']['median']:.2f} | {res['peak_mb']['median']:.0f} "
            f"| {r1} | {mapr} | {nmi} |"
        )
        if name == "lower_bound":
            p = res["parts_seconds"]
            lines.append(f"| &nbsp;&nbsp;kNN search, k = {KNN_K} | {_fmt_s(p['knn_s'])} | | | | | |")
            lines.append(f"| &nbsp;&nbsp;k-means, k = {s['classes']:,} | {_fmt_s(p['kmeans_s'])} | | | | | |")
        if name in ("project", "project_nmi3") and "parts_seconds" in res:
            p = res["parts_seconds"]
            lines.append(f"| &nbsp;&nbsp;retrieval_metrics | {_fmt_s(p['retrieval_s'])} | | | | | |")
            lines.append(f"| &nbsp;&nbsp;nmi (k-means++ seeding {p['seeding_s']['median']:.2f} s) | {_fmt_s(p['nmi_s'])} | | | | | |")
    lines.append("")
    r = entry["ratios"]
    for name, what in (("project", "Project"), ("project_nmi3", "Project with nmi_runs=3")):
        if f"{name}_over_lower_bound_time" in r:
            t = r[f"{name}_meets_target"]
            lines.append(
                f"{what} / lower bound: time {r[f'{name}_over_lower_bound_time']:.2f}x (target <= {TARGET_TIME_RATIO}x: "
                f"{'met' if t['time_ok'] else 'not met'}), peak memory {entry['methods'][name]['peak_mb']['median']:.0f} MB "
                f"(target < {TARGET_PEAK_MB:.0f} MB: {'met' if t['peak_ok'] else 'not met'})."
            )
    its = {name: res["kmeans_iterations"] for name, res in entry["methods"].items() if "kmeans_iterations" in res}
    if its:
        runs = "; ".join(f"{k} {v[0]}" for k, v in its.items())
        lines.append(f"Lloyd iterations per k-means run (faiss stops once the objective stops changing): {runs}.")
    lines.append("")
    for key, a in entry["agreement"].items():
        values = ", ".join(f"{k} {v:.4f}" for k, v in a["values"].items())
        verdict = "agree" if a["agree"] else "differ"
        lines.append(f"- {key}: {values}; max difference {a['max_abs_difference']:.4f} (tolerance {a['tolerance']}: {verdict})")
    lines.append("")
    return lines


def curve_table(curve: list[dict[str, Any]]) -> list[str]:
    header = ["N", "C", "project s", "lower bound s (kNN + k-means)", "ratio", "project peak MB", "lower bound peak MB"]
    rows = []
    for e in curve:
        p, lb = e["methods"]["project"], e["methods"]["lower_bound"]
        knn, kmeans = lb["parts_seconds"]["knn_s"]["median"], lb["parts_seconds"]["kmeans_s"]["median"]
        lower = f"{lb['seconds']['median']:.2f} ({knn:.2f} + {kmeans:.2f})"
        ratio = e["ratios"]["project_over_lower_bound_time"]
        shape = f"{e['shape']['n']:,}", f"{e['shape']['classes']:,}"
        sizes = f"{p['seconds']['median']:.2f}", lower, f"{ratio:.2f}", f"{p['peak_mb']['median']:.0f}", f"{lb['peak_mb']['median']:.0f}"
        rows.append((*shape, *sizes))
    return harness.table(header, rows)


def _load(values: Any) -> str:
    return "/".join(f"{v:.1f}" for v in values) if values else "n/a"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "### Evaluation at retrieval-benchmark scale",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"Machine: {m['cores']} CPUs ({m['cpu']}), {m['memory_gb']:.0f} GiB; threads: faiss {m['threads']['faiss_omp']}, "
        f"torch {m['threads']['torch']}; load average (1/5/15 min) at start {_load(m['load_average_at_start'])}, "
        f"at end {_load(m['load_average_at_end'])}. "
        f"numpy {m['numpy']}, torch {m['torch']}, faiss {m['faiss']}, scikit-learn {m['sklearn']}, "
        f"pytorch-metric-learning {m['pytorch_metric_learning']}. {report['created']}.",
        "",
        f"Synthetic unit-norm embeddings (class centre + gaussian noise, noise set for Recall@1 about {TARGET_RECALL_AT_1}). "
        f"Each number is the median over {report['settings']['repeats']} fresh processes; peak MB is the process's peak RSS "
        "minus its RSS after loading the data. Project: `evaluate_embeddings(x, y, ks=(1, 10, 100))` with its defaults, "
        "so NMI comes from one k-means run (`nmi_runs=1`) seeded with k-means++; the lower bound and "
        "pytorch-metric-learning run k-means once, from k random points. "
        f"Lower bound: one `faiss.IndexFlatIP` search with k = {KNN_K} plus one `faiss.Kmeans` (faiss defaults), "
        "without the final assignment search that NMI needs.",
        "",
    ]
    for entry in report["shapes"]:
        lines += shape_table(entry)
    if report.get("curve"):
        lines += [f"#### Scaling: D = {CURVE_D}, C = N / {SOP_IMAGES_PER_CLASS}", ""]
        lines += curve_table(report["curve"])
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eval_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=parse_shape, default=[parse_shape("8131x64x98"), parse_shape("60502x512x11316")])
    parser.add_argument("--curve", type=parse_curve, default=None, help="comma-separated N for the scaling curve (D = 512, C = N / 5.35)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--curve-repeats", type=int, default=None, help="repeats for the curve (default: --repeats)")
    parser.add_argument("--out", type=Path, default=harness.ROOT / "docs" / "bench" / "eval.json")
    parser.add_argument("--skip-references", action="store_true", help="measure only the project and the lower bound")
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one:
        child_main(args.one, args.data, args.result)
        return 0
    if args.repeats < 1 or (args.curve_repeats is not None and args.curve_repeats < 1):
        parser.error("--repeats and --curve-repeats must be >= 1")

    command = harness.command("eval_bench", sys.argv[1:] if argv is None else argv)
    methods = ("project", "project_nmi3", "lower_bound") if args.skip_references else METHODS
    report: dict[str, Any] = {
        "command": command,
        "created": harness.now(),
        "machine": machine_info(),
        "settings": {
            "repeats": args.repeats,
            "curve_repeats": args.curve_repeats or args.repeats,
            "ks": list(KS),
            "knn_k": KNN_K,
            "seed": SEED,
            "target_recall_at_1": TARGET_RECALL_AT_1,
            "tolerance_retrieval": TOLERANCE_RETRIEVAL,
            "tolerance_nmi": TOLERANCE_NMI,
            "methods": list(methods),
        },
        "shapes": [],
        "curve": [],
    }

    def log(msg: str) -> None:
        print(msg, flush=True)

    root = Path(tempfile.mkdtemp(prefix="eval_bench_"))
    try:
        for n, d, c in args.sizes:
            log(f"shape {n}x{d}x{c}")
            report["shapes"].append(run_shape(n, d, c, methods, args.repeats, root, log))
        for n in args.curve or []:
            c = curve_classes(n)
            log(f"curve {n}x{CURVE_D}x{c}")
            report["curve"].append(run_shape(n, CURVE_D, c, ("project", "lower_bound"), args.curve_repeats or args.repeats, root, log))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    report["machine"]["load_average_at_end"] = harness.load()
    harness.write(args.out, json.dumps(report, indent=2) + "\n")
    md = markdown(report)
    harness.write(args.out.with_suffix(".md"), md + "\n")
    print(f"\n{md}\nwrote {args.out} and {args.out.with_suffix('.md')}")
    targets = [(e["shape"]["n"], e["ratios"]["project_meets_target"]) for e in report["shapes"] if "project_meets_target" in e["ratios"]]
    met = ", ".join(f"N = {n:,}: {'met' if t['time_ok'] and t['peak_ok'] else 'not met'}" for n, t in targets)
    statement = f"the project within {TARGET_TIME_RATIO}x the lower bound's time and under {TARGET_PEAK_MB:.0f} MB at every shape ({met})"
    return harness.bound(all(t["time_ok"] and t["peak_ok"] for _, t in targets) if targets else None, statement)


if __name__ == "__main__":
    sys.exit(main())
