"""Which epoch reports of a trial carry a checkpoint: at most one per ``every_s`` seconds.

Ray Tune keeps a trial's newest ``CheckpointConfig(num_to_keep)`` checkpoints, and so that its experiment
snapshot never names a deleted one it snapshots the whole experiment state (every trial of the study) as soon
as any trial has checkpointed ``num_to_keep`` times since the last snapshot. With a checkpoint per epoch and
short epochs that is a snapshot every few seconds, each the size of the study: the driver's cost per trial
then grows with the number of trials (docs/performance.md, a study at cluster scale). A trial therefore
checkpoints an epoch only when ``every_s`` seconds have passed since its last checkpoint (or its start): every
epoch with ``every_s`` 0, and otherwise a trial that is stopped, killed or moved retrains at most ``every_s``
seconds of epochs.

Imports no torch: the surrogate trainable uses it too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CheckpointCadence:
    """A trial's checkpoint clock: ``take()`` after each epoch says whether its report carries a checkpoint."""

    every_s: float = 0.0  # seconds between checkpoints; 0: every epoch
    clock: Callable[[], float] = time.monotonic
    last: float = field(init=False)  # when the trial started or last checkpointed (``clock`` time)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.every_s) and self.every_s >= 0):
            raise ValueError(f"checkpoint_every_s {self.every_s!r}: expected seconds, a finite number >= 0")
        self.last = self.clock()

    def take(self) -> bool:
        """True when the epoch just finished is checkpointed (and from now on counts as the last checkpoint)."""
        now = self.clock()
        if now - self.last < self.every_s:
            return False
        self.last = now
        return True
