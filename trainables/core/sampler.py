"""Batches of C classes x k images (004_44fc264e74e143df, sec. 4: batch content C x k).

Each epoch shuffles the classes and walks through them C at a time; every
class in a batch contributes k images drawn without replacement, or with
replacement when the class has fewer than k. The batches of an epoch are a
pure function of (seed, epoch), so a run resumes mid-epoch by skipping the
batches it already trained on.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class ClassBatchSampler:
    """Yields lists of C * k dataset indices, grouped class by class.

    labels: (N,) class ids of the dataset the indices refer to.
    batches_per_epoch: defaults to N // (C * k) (at least 1), i.e. about one
    pass over the images.
    """

    def __init__(
        self,
        labels: np.ndarray,
        classes_per_batch: int,
        samples_per_class: int,
        *,
        seed: int = 0,
        batches_per_epoch: int | None = None,
    ) -> None:
        labels = np.asarray(labels)
        self.classes = np.unique(labels)
        if classes_per_batch > len(self.classes):
            raise ValueError(
                f"classes_per_batch={classes_per_batch} is larger than the {len(self.classes)} classes "
                "available for training; expected classes_per_batch <= the number of fit classes"
            )
        if samples_per_class < 1:
            raise ValueError(f"samples_per_class={samples_per_class}; expected an integer >= 1")
        self.by_class = [np.flatnonzero(labels == c) for c in self.classes]
        self.C, self.k, self.seed = classes_per_batch, samples_per_class, seed
        self.batches_per_epoch = batches_per_epoch or max(1, len(labels) // (self.C * self.k))
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return self.batches_per_epoch

    def batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch``, a pure function of (seed, epoch)."""
        rng = np.random.default_rng([self.seed, epoch])
        out: list[list[int]] = []
        order = rng.permutation(len(self.classes))
        cursor = 0
        for _ in range(self.batches_per_epoch):
            if cursor + self.C > len(order):
                order, cursor = rng.permutation(len(self.classes)), 0
            batch: list[int] = []
            for c in order[cursor : cursor + self.C]:
                members = self.by_class[c]
                batch.extend(rng.choice(members, self.k, replace=len(members) < self.k).tolist())
            cursor += self.C
            out.append(batch)
        return out

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches(self.epoch)
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield batch
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
