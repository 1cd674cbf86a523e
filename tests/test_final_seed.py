"""study.final's seed: its pictures and pair similarities use the final evaluation's test embeddings, one pass over the test images."""

from __future__ import annotations

import numpy as np
import pytest

from study.final import seed as final
from study.final.placement import SeedJob
from trainables.core import engine
from trainables.core.config import TrainConfig
from trainables.core.data import DatasetSplits, load_dataset


@pytest.mark.parametrize("gallery", [False, True], ids=["self-retrieval", "query-gallery"])
def test_a_seed_embeds_its_test_images_once_and_draws_what_it_scored(monkeypatch, one_thread, gallery):
    splits = load_dataset("synthetic", None, 0)
    if gallery:  # the test images split in two, as In-shop's queries and gallery
        index = np.arange(len(splits.test))
        splits = DatasetSplits(splits.train, splits.test.subset(index[::2]), splits.test.subset(index[1::2]))
    config = TrainConfig.from_dict(dict(dataset="synthetic", epochs=1, classes_per_batch=8, samples_per_class=2, embedding_dim=16))
    passes, runs, drawn = [], [], []
    real_embed, real_fit, real_pairs = engine.embed, final.fit, final.pair_similarities

    def counting_embed(model, images, *args, **kwargs):
        passes.append(set(images.classes))
        return real_embed(model, images, *args, **kwargs)

    def keeping_fit(*args, **kwargs):
        runs.append(real_fit(*args, **kwargs))
        return runs[-1]

    def seen_pairs(embeddings, *args, **kwargs):
        drawn.append(embeddings)
        return real_pairs(embeddings, *args, **kwargs)

    monkeypatch.setattr(engine, "embed", counting_embed)
    monkeypatch.setattr(final, "embed", counting_embed, raising=False)  # where study.final embedded the test set itself
    monkeypatch.setattr(final, "fit", keeping_fit)
    monkeypatch.setattr(final, "pair_similarities", seen_pairs)
    job = SeedJob(index=0, config=config, device="cpu", num_workers=0, threads=None, data_root=None)
    output = final.train_seed(job, splits, lambda report: None)

    assert passes.count(set(splits.test.classes)) == (2 if gallery else 1), "the test images were embedded more than once"
    run = runs[0]
    fresh = real_embed(run.model, run.eval_set, run.image_size, run.device, plan=run.plan).numpy()
    assert drawn[0].shape == fresh.shape == (len(splits.test), 16)
    assert (drawn[0] == fresh).all()  # what the pictures show is the model's embedding of the test set, exactly
    assert output.test["test_recall_at_1"] == run.metrics["test_recall_at_1"]
    assert set(output.pictures) == {"similarity_histogram_seed0.png", "retrieval_grid_seed0.png", "tsne_seed0.png"}
