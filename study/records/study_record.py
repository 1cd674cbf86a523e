"""The study's record: the settings a study runs with, as its MLflow parent run keeps them.

One frozen ``StudyRecord`` is written once, as the parent run's params (``to_params``), and read back by
everything that continues or describes a study (``from_params``): ``study.launch --resume``, ``study.report``,
``study.final --study``, ``study.sync`` and the trial recorder. Each field says how its param reads back and
what it was for a study recorded before the field existed (``old``), once, here.

A field marked ``flag`` is a study-defining flag of ``study.launch`` of the same name: ``--resume`` continues
the study with the recorded value and refuses the flag given with another. Adding a recorded flag is a field
here and the flag in the parser.

This module imports neither Ray nor torch: every command reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from study.inputs import UsageError, redacted

# the objective metrics a study can optimize, each with its mode (declared once)
METRICS = {"val_recall_at_1": "max", "val_map_at_r": "max", "val_nmi": "max", "val_r_precision": "max"}
FIXED_PREFIX = "fixed."  # the space's fixed values are params fixed.<key>


def recorded(parse: Callable[[str], Any], *, old: Any = dataclasses.MISSING, flag: bool = False) -> Any:
    """A field of the record: ``parse`` reads its param back; ``old`` (a value, or a function of the values read
    before it) stands in for a study recorded before the field existed; ``flag``: a study-defining flag."""
    return field(metadata={"parse": parse, "old": old, "flag": flag})


def _int(text: str) -> int:
    return int(float(text))


def _bool(text: str) -> bool:
    return text.strip().lower() in ("true", "1", "yes")


def _budgets(text: str) -> tuple[int, ...]:
    return tuple(int(b) for b in text.split())


def _optional(text: str) -> str | None:
    return None if text in ("", "None", "none") else text


def _optional_float(text: str) -> float | None:
    return None if text in ("", "None", "none") else float(text)


def _optional_int(text: str) -> int | None:
    return None if text in ("", "None") else _int(text)


@dataclass(frozen=True)
class StudyRecord:
    """What a study's parent run records (params of the same names); see the module docstring."""

    space: str = recorded(str, flag=True)  # the space file's path
    epochs: int = recorded(_int, flag=True)  # every trial's full budget
    num_samples: int = recorded(_int, flag=True)
    scheduler: str = recorded(str, old="asha", flag=True)  # studies before the budget scheduler ran stock ASHA
    grace_period: int = recorded(_int, old=lambda v: max(1, v["epochs"] // 4), flag=True)
    reduction_factor: float = recorded(float, old=4.0, flag=True)
    sampler: str = recorded(str, old="tpe", flag=True)  # "grid" for a grid space: no sampler applies
    seed: int = recorded(_int, flag=True)
    metric: str = recorded(str, flag=True)
    confirm_top: int = recorded(_int, old=3, flag=True)
    # the race's budget, a share of the search's epochs (study.search.race); a study recorded before the race (it re-ran
    # its top trials with seeds) resumes without one
    confirm_budget: float = recorded(float, old=0.0, flag=True)
    # which folds the race holds out: "trial" (the split the trials are scored on, config key val_split) or
    # "alphabets" (whole alphabets, whatever the trials' split)
    race_folds: str = recorded(str, old="trial", flag=True)
    max_concurrent: int | None = recorded(_optional_int, flag=True)  # resolved at the study's start: what --resume continues with
    cpus_per_trial: float = recorded(float, flag=True)
    gpus_per_trial: float = recorded(float, flag=True)
    rehearse: float | None = recorded(_optional_float, old=None, flag=True)  # a rehearsal: seconds per surrogate epoch
    mode: str = recorded(str, old=lambda v: METRICS.get(v["metric"], "max"))
    budgets: tuple[int, ...] = recorded(_budgets, old=())  # the budget scheduler's ladder
    stratify_by: str | None = recorded(_optional, old=None)  # the key the budget scheduler compares trials apart by
    reuse_actors: bool = recorded(_bool, old=True)
    final_epochs: int | None = recorded(_optional_int, old=None)  # what study.final --study trains the pick to (None: the trials' epochs)
    optuna_storage: str = recorded(str, flag=True)  # where the study is: --resume NAME needs nothing else
    storage_path: str = recorded(str, flag=True)
    fit_classes: int = recorded(_int)
    val_folds: int = recorded(_int, old=1)  # the race's class-disjoint validation folds of the data (trainables.core.data)
    data_root: str | None = recorded(_optional, old=None)
    fixed: Mapping[str, str] = field(default_factory=dict)  # the space's fixed values (params fixed.<key>, as text)

    @property
    def dataset(self) -> str | None:
        """The dataset the space fixes (``--dataset``), None when it searches or varies it."""
        return self.fixed.get("dataset")

    def to_params(self) -> dict[str, str]:
        """The parent run's params: each field as text (None as "none"), the fixed values as ``fixed.<key>``."""
        params = {}
        for f in dataclasses.fields(self):
            if f.name == "fixed":
                continue
            value = getattr(self, f.name)
            if f.name == "data_root" and value is None:
                continue  # a study without a data root records none (the trainables' default applies)
            text = " ".join(map(str, value)) if isinstance(value, tuple) else "none" if value is None else str(value)
            params[f.name] = redacted(text)  # a store's URL may carry a password: never recorded
        return {**params, **{f"{FIXED_PREFIX}{k}": str(v) for k, v in self.fixed.items()}}

    @classmethod
    def from_params(cls, params: Mapping[str, str], where: str = "the study's parent run") -> StudyRecord:
        """The record of a parent run's params; a field an older version did not record takes its ``old`` value."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "fixed":
                continue
            old = f.metadata["old"]
            if f.name in params:
                try:
                    values[f.name] = f.metadata["parse"](params[f.name])
                except ValueError:
                    raise UsageError(f"{where}: param {f.name} {params[f.name]!r} does not read as a {f.type}") from None
            elif old is not dataclasses.MISSING:
                values[f.name] = old(values) if callable(old) else old
            else:
                raise UsageError(f"{where}: no param {f.name}; expected the parent run of a study.launch study")
        fixed = {k.removeprefix(FIXED_PREFIX): v for k, v in params.items() if k.startswith(FIXED_PREFIX)}
        return cls(**values, fixed=fixed)

    def flags(self) -> dict[str, Any]:
        """The study-defining flags (``dest: value``) that ``--resume`` continues with; a grid records no sampler,
        a study whose space did not fix its dataset records no ``--dataset``, and a store recorded without its
        password (``user:***@``) is given again (``--resume`` compares it, redacted, and needs it)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("flag")}
        if values["sampler"] == "grid":
            del values["sampler"]
        for flag in ("max_concurrent", "rehearse"):
            if values[flag] is None:
                del values[flag]
        if self.dataset is not None:
            values["dataset"] = self.dataset
        return values


def flag_names() -> tuple[str, ...]:
    """The ``study.launch`` flags (dests) that a study records and ``--resume`` continues with."""
    return (*(f.name for f in dataclasses.fields(StudyRecord) if f.metadata.get("flag")), "dataset")
