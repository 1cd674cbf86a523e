"""Search spaces: YAML files in Optuna's vocabulary -> validated define-by-run functions.

A space file has these top-level keys (all optional but one of params,
grid, variants):

```yaml
description: what the space is for
fixed:                 # config keys held constant in every trial
  epochs: 12
params:                # searched, in this order (a parameter may refer to earlier ones)
  loss: {type: categorical, choices: [softmax, ice]}
  alpha: {type: float, low: 2, high: 64, log: true, when: {loss: softmax}}
  heating_target: {type: float, low: 1, high: {param: alpha}, log: true,
                   when: {loss: softmax, heating: [two_stage, linear, cosine]}}
  classes_per_batch: {type: int, low: 8, high: 32, step: 8}
grid:                  # or: a cartesian grid over config keys (Optuna's GridSampler)
  ice_scale: [1, 16, 32, 64, 80]
variants:              # or: named configurations tried one by one (a grid over 'variant')
  SM: {normalization: none, weight_norm: false, alpha: 1, heating: none}
final_budget_factor: 2 # study.final --study trains the pick to 2 x the trials' epochs (default 1)
```

``when`` makes a parameter active only when earlier parameters have the given
value (or one of a list); inactive parameters keep TrainConfig's defaults.
A bound ``{param: NAME}`` takes the value of an earlier (or fixed) parameter.
Every name is a config key (the one config contract: the same name in YAML, Optuna, Tune, MLflow and checkpoints), so the Optuna parameter
names, the Tune config and the MLflow params agree; the one exception is
``variant``, the name of the chosen configuration in a ``variants`` space.

``final_budget_factor`` scales the budget of the final model only: every
schedule is defined as a fraction of the budget (trainables.core.schedule),
so the picked config trained to a longer budget is the same recipe, run
longer. The study records the result as its parent run's ``final_epochs``.

``final_budget_factor`` lies in [1, 100], and the final epochs within the
range of ``epochs``.

:func:`load_space` validates the whole file before anything starts: every
bound, choice and grid value lies in its config key's range
(``trainables.core.config.RANGES``, the ranges TrainConfig checks), and
sampled combinations make valid TrainConfigs. Errors are :class:`SpaceError`
naming the file, the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from study.inputs import UsageError, read_yaml
from trainables.core.config import CHOICES, FINAL_BUDGET_FACTOR, FLOAT32_MAX, RANGES, ConfigError, TrainConfig, range_problem

TOP_LEVEL = ("description", "fixed", "params", "grid", "variants", "final_budget_factor")
PARAM_KEYS = {
    "float": ("type", "low", "high", "log", "step", "when"),
    "int": ("type", "low", "high", "log", "step", "when"),
    "categorical": ("type", "choices", "when"),
}
VARIANT = "variant"
SHIPPED = Path(__file__).resolve().parents[2] / "search_spaces"


class SpaceError(UsageError):
    """A search space file is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    low: Any = None
    high: Any = None
    log: bool = False
    step: Any = None
    choices: tuple = ()
    when: dict[str, tuple] = field(default_factory=dict)

    def bound(self, value: Any, values: dict[str, Any], path: str) -> Any:
        if not isinstance(value, dict):
            return value
        if value["param"] not in values:
            raise SpaceError(
                f"{path}: params.{self.name}: its bound refers to {value['param']!r}, which is inactive here; "
                f"expected a reference to a parameter active whenever {self.name} is (add a matching when)"
            )
        return values[value["param"]]


@dataclass
class Space:
    """A validated search space; :meth:`suggest` is its define-by-run function."""

    path: str
    description: str = ""
    fixed: dict[str, Any] = field(default_factory=dict)
    params: list[Param] = field(default_factory=list)
    grid: dict[str, list] = field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    final_budget_factor: float = 1.0

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def is_grid(self) -> bool:
        return bool(self.grid or self.variants)

    def grid_search_space(self) -> dict[str, list]:
        """The search space of Optuna's GridSampler (grid and variants spaces only)."""
        return {VARIANT: list(self.variants)} if self.variants else dict(self.grid)

    def final_epochs(self, epochs: int) -> int:
        """The epochs study.final trains the pick of a study whose trials train to ``epochs``."""
        return max(epochs, int(self.final_budget_factor * epochs + 0.5))  # half up

    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.grid_search_space().values()) if self.is_grid else 0

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Define-by-run: ask ``trial`` for every active parameter; returns {name: value}."""
        if self.variants:
            return {VARIANT: trial.suggest_categorical(VARIANT, list(self.variants))}
        if self.grid:
            return {name: trial.suggest_categorical(name, values) for name, values in self.grid.items()}
        values: dict[str, Any] = dict(self.fixed)
        chosen: dict[str, Any] = {}
        for p in self.params:
            if any(values.get(key) not in allowed for key, allowed in p.when.items()):
                continue
            if p.type == "categorical":
                value = trial.suggest_categorical(p.name, list(p.choices))
                values[p.name] = chosen[p.name] = value
                continue
            low, high = p.bound(p.low, values, self.path), p.bound(p.high, values, self.path)
            if low > high or (p.log and low <= 0):
                raise SpaceError(
                    f"{self.path}: params.{p.name}: the range [{low}, {high}] drawn from its references is empty "
                    "or not positive for log; expected references that keep low <= high"
                )
            if p.type == "int":
                value = trial.suggest_int(p.name, int(low), int(high), step=p.step or 1, log=p.log)
            else:
                value = trial.suggest_float(p.name, low, high, step=p.step, log=p.log)
            values[p.name] = chosen[p.name] = value
        return chosen

    def to_config(self, suggested: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The flat config dict of a trial: fixed values, the suggestion, then ``overrides``."""
        values = {**self.fixed}
        if VARIANT in suggested:
            values.update(self.variants[suggested[VARIANT]])
        values.update({k: v for k, v in suggested.items() if k != VARIANT})
        values.update(overrides or {})
        return values


def _fail(path: str, key: str, message: str) -> SpaceError:
    return SpaceError(f"{path}: {key}: {message}")


def _in_range(path: str, where: str, name: str, values: Any, bound: bool = False) -> None:
    """Each of ``values`` must lie in config key ``name``'s range (config.RANGES); ``bound``: as an end of a searched range."""
    for value in values:
        problem = range_problem(name, value, bound)
        if problem:
            raise _fail(path, where, f"{value!r} is not allowed; {problem}")


def _number(path: str, key: str, value: Any, kind: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, key, f"{value!r} is not a number; expected {'an integer' if kind == 'int' else 'a number'} or {{param: NAME}}")
    if isinstance(value, float) and not math.isfinite(value):  # an int is finite, and isfinite raises for one beyond float's range
        raise _fail(path, key, f"{value!r} is not a finite number; expected {'an integer' if kind == 'int' else 'a finite number'}")
    if kind == "int" and isinstance(value, float) and not value.is_integer():
        raise _fail(path, key, f"{value!r} is not an integer; expected an integer for type int")
    # an int beyond float32's range stays an int (float() raises beyond 1.8e308): the key's range refuses it by name
    return int(value) if kind == "int" or abs(value) > FLOAT32_MAX else float(value)


def _parse_param(path: str, name: str, spec: Any, defined: set[str]) -> Param:
    where = f"params.{name}"
    if name not in TrainConfig.keys():
        raise _fail(path, where, f"unknown parameter; expected a config key ({', '.join(TrainConfig.keys())})")
    if not isinstance(spec, dict):
        spec = {"type": "categorical", "choices": [spec]} if not isinstance(spec, list) else {"type": "categorical", "choices": spec}
    kind = spec.get("type")
    if kind not in PARAM_KEYS:
        raise _fail(path, f"{where}.type", f"{kind!r}; expected one of float, int, categorical")
    extra = sorted(set(spec) - set(PARAM_KEYS[kind]))
    if extra:
        raise _fail(path, f"{where}.{extra[0]}", f"not allowed for type {kind}; expected keys {', '.join(PARAM_KEYS[kind])}")
    when_raw = spec.get("when") or {}
    if not isinstance(when_raw, dict):
        raise _fail(path, f"{where}.when", "expected a mapping {parameter: value or [values]}")
    when = {}
    for key, value in when_raw.items():
        if key not in defined:
            raise _fail(path, f"{where}.when.{key}", "condition on a parameter that is not defined earlier in params or in fixed")
        when[key] = tuple(value) if isinstance(value, list) else (value,)
        # a value the key cannot take (a typo) would silently mean the parameter is never searched; one the key allows
        # but this space does not search (a space narrowed from another) is a condition that stays false, as written
        allowed = CHOICES.get(key)
        for value in when[key]:
            if allowed is not None and value not in allowed:
                expected = ", ".join(repr(v) for v in allowed)
                raise _fail(path, f"{where}.when.{key}", f"{value!r} is no value of {key}; expected one of {expected}")
        if key in RANGES:
            _in_range(path, f"{where}.when.{key}", key, when[key])
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _fail(path, f"{where}.choices", "expected a non-empty list of values")
        if any(isinstance(c, (dict, list)) or c is None for c in choices):
            raise _fail(path, f"{where}.choices", "expected scalar values (numbers, strings, booleans)")
        _in_range(path, f"{where}.choices", name, choices)
        return Param(name, kind, choices=tuple(choices), when=when)
    bounds = {}
    for key in ("low", "high"):
        if key not in spec:
            raise _fail(path, f"{where}.{key}", f"missing; type {kind} needs low and high")
        value = spec[key]
        if isinstance(value, dict):
            if set(value) != {"param"} or value["param"] not in defined:
                raise _fail(path, f"{where}.{key}", "a reference must be {param: NAME} with NAME defined earlier in params or in fixed")
            bounds[key] = value
        else:
            bounds[key] = _number(path, f"{where}.{key}", value, kind)
            _in_range(path, f"{where}.{key}", name, [bounds[key]], bound=True)
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise _fail(path, f"{where}.log", f"{log!r}; expected true or false")
    step = spec.get("step")
    if step is not None:
        step = _number(path, f"{where}.step", step, kind)
        if step <= 0:
            raise _fail(path, f"{where}.step", f"{step}; expected a number > 0")
        if log:
            raise _fail(path, f"{where}.step", "cannot be combined with log: true (Optuna's rule)")
    low, high = bounds["low"], bounds["high"]
    if not isinstance(low, dict) and not isinstance(high, dict) and low > high:
        raise _fail(path, where, f"low={low} > high={high}; expected low <= high")
    if log and not isinstance(low, dict) and low <= 0:
        raise _fail(path, f"{where}.low", f"{low}; a log range must lie above 0")
    return Param(name, kind, low=low, high=high, log=log, step=step, when=when)


def parse_space(data: Any, path: str) -> Space:
    """Build a Space from parsed YAML and validate it (including sampled combinations)."""
    if not isinstance(data, dict):
        raise SpaceError(f"{path}: expected a mapping with keys {', '.join(TOP_LEVEL)}")
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise _fail(path, unknown[0], f"unknown top-level key; expected {', '.join(TOP_LEVEL)}")
    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise _fail(path, "fixed", "expected a mapping of config keys to values")
    for key in fixed:
        if key not in TrainConfig.keys():
            raise _fail(path, f"fixed.{key}", f"unknown parameter; expected a config key ({', '.join(TrainConfig.keys())})")
    factor = data.get("final_budget_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not FINAL_BUDGET_FACTOR.accepts(factor):
        raise _fail(path, "final_budget_factor", f"{factor!r} is not allowed; expected {FINAL_BUDGET_FACTOR.describe('float')}")
    space = Space(path=path, description=str(data.get("description") or ""), fixed=dict(fixed), final_budget_factor=float(factor))
    params_raw, grid_raw, variants_raw = data.get("params") or {}, data.get("grid") or {}, data.get("variants") or {}
    if sum(bool(x) for x in (params_raw, grid_raw, variants_raw)) != 1:
        raise SpaceError(f"{path}: expected exactly one of params, grid or variants")
    if params_raw:
        if not isinstance(params_raw, dict):
            raise _fail(path, "params", "expected a mapping of parameter name to spec")
        defined = set(fixed)
        for name, spec in params_raw.items():
            if name in fixed:
                raise _fail(path, f"params.{name}", "also in fixed; a parameter is either fixed or searched")
            space.params.append(_parse_param(path, name, spec, defined))
            defined.add(name)
    if grid_raw:
        if not isinstance(grid_raw, dict):
            raise _fail(path, "grid", "expected a mapping of config key to a list of values")
        for name, values in grid_raw.items():
            if name not in TrainConfig.keys():
                raise _fail(path, f"grid.{name}", f"unknown parameter; expected a config key ({', '.join(TrainConfig.keys())})")
            if not isinstance(values, list) or not values:
                raise _fail(path, f"grid.{name}", "expected a non-empty list of values")
            _in_range(path, f"grid.{name}", name, values)
            space.grid[name] = values
    if variants_raw:
        if not isinstance(variants_raw, dict):
            raise _fail(path, "variants", "expected a mapping of variant name to config values")
        for name, values in variants_raw.items():
            if not isinstance(values, dict):
                raise _fail(path, f"variants.{name}", "expected a mapping of config keys to values")
            space.variants[str(name)] = dict(values)
    _check_combinations(space)
    return space


def _check_combinations(space: Space, samples: int = 300) -> None:
    """Every grid point, and many random samples of a searched space, must make a valid TrainConfig."""
    if space.is_grid:
        names = list(space.grid_search_space())
        points = [dict(zip(names, combo)) for combo in itertools.product(*space.grid_search_space().values())]
    else:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        points = []
        for _ in range(samples):
            trial = study.ask()
            try:
                points.append(space.suggest(trial))
            except (ValueError, TypeError, OverflowError) as error:  # e.g. a referenced bound below low
                raise SpaceError(f"{space.path}: a sampled combination cannot be drawn ({error})") from None
            study.tell(trial, 0.0)
    epochs: set[int] = set()
    for point in points:
        label = f"{space.path} ({', '.join(f'{k}={v!r}' for k, v in point.items())})"
        try:
            epochs.add(TrainConfig.from_dict(space.to_config(point), source=label).epochs)
        except ConfigError as error:
            raise SpaceError(str(error)) from None
    final = space.final_epochs(max(epochs))  # study.final trains the pick to this many epochs
    if not RANGES["epochs"].accepts(final):
        raise _fail(
            space.path,
            "final_budget_factor",
            f"{space.final_budget_factor:g} x the trials' {max(epochs)} epochs = {final} final epochs is not allowed; "
            f"expected the final epochs to be {RANGES['epochs'].describe('int')}",
        )


BUILTIN_WEIGHTS = ("none", "imagenet")  # values of ``pretrained`` that are not files


def _weights_file(path: str, key: str, value: Any, base: Path) -> Any:
    """A ``pretrained`` value as an absolute path of an existing file (relative ones against ``base``); names pass as they are."""
    if not isinstance(value, str) or value in BUILTIN_WEIGHTS:
        return value
    file = (base / Path(value).expanduser()).resolve()
    if not file.is_file():
        raise _fail(
            path,
            key,
            f"pretrained {value!r}: no such file ({file}, relative to the launch's folder {base}); "
            f"expected {', '.join(BUILTIN_WEIGHTS)} or the path of a weights file",
        )
    return str(file)


def resolve_pretrained(space: Space, base: Path) -> Space:
    """``space`` with every ``pretrained`` weights file made absolute against ``base`` (the launch's working directory).

    Trials run in folders of their own, where a relative path names nothing; a missing file is a SpaceError here,
    before any trial starts.
    """
    key = "pretrained"

    def weights(where: str, value: Any) -> Any:
        return _weights_file(space.path, where, value, base)

    fixed = {**space.fixed, key: weights(f"fixed.{key}", space.fixed[key])} if key in space.fixed else space.fixed
    params = [
        dataclasses.replace(p, choices=tuple(weights(f"params.{key}.choices", c) for c in p.choices)) if p.name == key else p
        for p in space.params
    ]
    grid = {**space.grid, key: [weights(f"grid.{key}", v) for v in space.grid[key]]} if key in space.grid else space.grid
    variants = {
        name: {**values, key: weights(f"variants.{name}.{key}", values[key])} if key in values else values
        for name, values in space.variants.items()
    }
    return dataclasses.replace(space, fixed=fixed, params=params, grid=grid, variants=variants)


def load_space(path: str | Path) -> Space:
    """Load and validate a space file; a bare name (``default``) means a shipped space."""
    path = Path(path)
    if not path.exists() and path.suffix == "" and (SHIPPED / f"{path}.yaml").is_file():
        path = SHIPPED / f"{path}.yaml"
    try:
        data = read_yaml(path, "a search space (see study/search/spaces.py)")
    except SpaceError:
        raise
    except UsageError as error:
        raise SpaceError(str(error)) from None
    return parse_space(data, str(path))


def shipped_spaces() -> list[Path]:
    return sorted(SHIPPED.glob("*.yaml"))
