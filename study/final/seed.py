"""One seed's task body: train a config on all training classes, test it, draw its pictures. Touches no MLflow; it
runs in the driver or in a Ray task (study.final.placement) and hands back a SeedOutput."""

from __future__ import annotations

import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from study.final.results import EpochReport, SeedJob, SeedOutput
from study.plots import pair_similarities, retrieval_examples, retrieval_grid, similarity_histogram, tsne_map
from trainables.core.data import DatasetSplits, ImageSet
from trainables.core.engine import Run, fit


def train_seed(job: SeedJob, splits: DatasetSplits, on_epoch: Callable[[EpochReport], None]) -> SeedOutput:
    """Train one seed on all training classes, test it, draw its pictures: in the driver or in a Ray task (study.final.placement).

    Touches no MLflow: the driver records the output (:class:`SeedRuns`). ``time_s`` is training and testing.
    """
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    config, started = job.config, time.perf_counter()

    def report(epoch: int, metrics: dict[str, float], run: Run) -> None:
        on_epoch(EpochReport(job.index, epoch, metrics))

    device = torch.device(job.device)
    run = fit(config, report, mode="final", splits=splits, device=device, eval_every=config.epochs, num_workers=job.num_workers)
    elapsed = time.perf_counter() - started
    test = {k: v for k, v in run.metrics.items() if k.startswith("test_")}
    embeddings = run.embeddings.queries.numpy()  # the final evaluation's: fit evaluates after the last epoch
    positive, negative = pair_similarities(embeddings, run.eval_set.labels, seed=config.seed)
    with tempfile.TemporaryDirectory() as tmp:
        histogram = similarity_histogram(
            positive,
            negative,
            Path(tmp) / f"similarity_histogram_seed{config.seed}.png",
            title=f"test pair similarities, seed {config.seed}",
        )
        gallery = None if run.embeddings.gallery is None else run.embeddings.gallery.numpy()
        what, stem = f"seed {config.seed}", f"seed{config.seed}"
        drawn = test_pictures(run.eval_set, run.gallery, embeddings, gallery, config.seed, what, stem, Path(tmp))
        pictures = {path.name: path.read_bytes() for path in (histogram, *drawn)}
    similarity = {"test_positive_similarity_mean": float(positive.mean()), "test_negative_similarity_mean": float(negative.mean())}
    bundle = {k: v for k, v in run.bundle().items() if k not in TRAINING_STATE}
    bundle["model"] = {k: v.detach().cpu() for k, v in bundle["model"].items()}  # a GPU's weights, read by a driver without one
    return SeedOutput(job.index, test, similarity, elapsed, bundle, pictures, socket.gethostname(), run.embeddings)


TRAINING_STATE = ("optimizer", "rng", "sampler", "loss")  # what a run's bundle holds to continue training; the model needs none


def test_pictures(
    queries_set: ImageSet,
    gallery: ImageSet | None,
    embeddings: np.ndarray,
    gallery_embeddings: np.ndarray | None,
    seed: int,
    what: str,
    stem: str,
    workdir: Path,
) -> tuple[Path, Path]:
    """The retrieval grid (8 test queries of different classes, their top 8) and a t-SNE map of ``embeddings``, (N, D)
    of ``queries_set``: a seed's model's (``what`` "seed 0") or the seeds' as one model's ("the final model").

    ``study.report`` shows both; neighbours come from ``gallery`` where the dataset has one (``gallery_embeddings``,
    (M, D)). Files ``retrieval_grid_<stem>.png`` and ``tsne_<stem>.png``.
    """
    queries, neighbours = retrieval_examples(embeddings, queries_set.labels, seed=seed, gallery_embeddings=gallery_embeddings)
    source = queries_set if gallery is None else gallery
    correct = np.asarray(source.labels)[neighbours] == np.asarray(queries_set.labels)[queries][:, None]
    grid = retrieval_grid(
        [queries_set.load(int(q)) for q in queries],
        [[source.load(int(j)) for j in row] for row in neighbours],
        correct,
        workdir / f"retrieval_grid_{stem}.png",
        title=f"test retrieval, {what}: query, then its 8 nearest neighbours ({int((~correct).sum())} of {correct.size} wrong: red)",
    )
    return grid, tsne_map(embeddings, queries_set.labels, workdir / f"tsne_{stem}.png", seed=seed)
