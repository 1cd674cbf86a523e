"""Tests of the YAML search spaces (study/search/spaces.py) and the launcher's checks (study/launch.py).

References: the shipped spaces are sampled with Optuna's own samplers (random, TPE, grid)
and every sample must make a valid TrainConfig; the ranges are the papers' (heated-up
softmax 000_4178e6910e81cd2f: alpha and Table 1's SM/LN/BN/HLN/HBN; ICE 004_44fc264e74e143df:
scale s; mean proxies 002_ad8188f3a39a9075: the regularizer weight); malformed files are
checked by the file and the key the one-line error must name. No Ray is started.

Each former bug found here has a test that pins its fix.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from pathlib import Path

import optuna
import pytest
import yaml

from study.inputs import UsageError
from study.launch import cli as launch
from study.launch.cli import parse_args
from study.launch.settings import check_dataset, max_classes_per_batch, prepare_space
from study.search.spaces import VARIANT, Space, SpaceError, load_space, shipped_spaces
from trainables.core.config import TrainConfig

optuna.logging.set_verbosity(optuna.logging.WARNING)

SHIPPED = {path.stem: path for path in shipped_spaces()}


@functools.cache
def shipped(name: str) -> Space:
    """A shipped space, loaded (and validated) once per test session; tests must not mutate it."""
    return load_space(SHIPPED[name])


def write(tmp_path: Path, text: str | dict, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text if isinstance(text, str) else yaml.safe_dump(text, sort_keys=False))
    return path


def sample(space: Space, sampler: optuna.samplers.BaseSampler, n: int, seed: int = 0) -> list[dict]:
    """n suggestions of ``space`` by ask/suggest/tell with random objective values."""
    study = optuna.create_study(sampler=sampler)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(space.suggest(trial))
        study.tell(trial, rng.random())
    return out


def in_range(space: Space, suggested: dict) -> None:
    """Every suggested value lies inside its parameter's declared range or choices."""
    values = {**space.fixed, **suggested}
    for p in space.params:
        if p.name not in suggested:
            continue
        value = suggested[p.name]
        if p.type == "categorical":
            assert value in p.choices, (p.name, value)
            continue
        low, high = p.bound(p.low, values, space.path), p.bound(p.high, values, space.path)
        assert low - 1e-9 <= value <= high + 1e-9, (p.name, value, low, high)
        if p.type == "int":
            assert isinstance(value, int)
            if p.step:
                assert (value - low) % p.step == 0, (p.name, value)


# -- 1. every shipped space samples valid configs -------------------------------------------------


def test_shipped_spaces_are_the_documented_ones():
    studies = {"default", "heated_softmax", "ice", "paper_ablation", "smoke"}
    presets = {"cub200", "cars196", "sop", "inshop"}  # the photo benchmarks at the papers' protocol (tests/test_presets.py)
    reproductions = {"repro_alpha", "repro_learnable_alpha", "repro_ice_scale", "repro_ice_batch", "repro_mean_proxy", "repro_reduction"}
    assert set(SHIPPED) == studies | presets | reproductions
    # the reproduction spaces are grids of fixed configurations, trained by study.final --space
    assert all(load_space(SHIPPED[name]).is_grid for name in reproductions)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_space_loads_by_path_and_by_name(name):
    by_path = load_space(SHIPPED[name])
    by_name = load_space(name)
    assert by_path.path == by_name.path == str(SHIPPED[name])
    assert by_path.description.strip()
    assert by_path.is_grid == bool(by_path.variants or by_path.grid)


@pytest.mark.parametrize("name", sorted(SHIPPED))
@pytest.mark.parametrize(
    "make_sampler, n",
    [(lambda: optuna.samplers.RandomSampler(seed=7), 200), (lambda: optuna.samplers.TPESampler(seed=7, n_startup_trials=10), 50)],
    ids=["random200", "tpe50"],
)
def test_shipped_space_samples_make_valid_configs(name, make_sampler, n):
    space = shipped(name)
    suggestions = sample(space, make_sampler(), n)
    assert len(suggestions) == n
    for suggested in suggestions:
        in_range(space, suggested)
        config = TrainConfig.from_dict(space.to_config(suggested), source=f"{name} {suggested}")
        for key, value in space.fixed.items():
            if key not in suggested and not (VARIANT in suggested and key in space.variants[suggested[VARIANT]]):
                assert getattr(config, key) == value, key
        if VARIANT not in suggested:
            for key, value in suggested.items():
                assert getattr(config, key) == value


def test_to_config_overrides_win():
    space = shipped("default")
    values = space.to_config({"loss": "ice", "ice_scale": 8.0}, {"epochs": 3, "seed": 5})
    assert values["epochs"] == 3 and values["seed"] == 5 and values["ice_scale"] == 8.0
    assert values["dataset"] == "omniglot"


def grid_points(space: Space) -> list[dict]:
    names = list(space.grid_search_space())
    return [dict(zip(names, combo)) for combo in itertools.product(*space.grid_search_space().values())]


def check_grid_space(space: Space) -> None:
    points = grid_points(space)
    assert len(points) == space.grid_size() > 0
    for point in points:
        TrainConfig.from_dict(space.to_config(point), source=str(point))
    study = optuna.create_study(sampler=optuna.samplers.GridSampler(space.grid_search_space(), seed=3))
    seen = []
    for i in range(space.grid_size()):
        trial = study.ask()
        suggested = space.suggest(trial)
        seen.append(tuple(sorted(suggested.items())))
        try:
            study.tell(trial, 0.5)
        except RuntimeError as error:
            # Optuna's documented ask/tell quirk (optuna/optuna#5141): GridSampler.after_trial calls
            # study.stop() after the last grid point, which raises outside optimize(); the trial is stored.
            assert i == space.grid_size() - 1 and "Study.stop" in str(error)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * space.grid_size()
    assert len(seen) == len(set(seen)) == space.grid_size()
    assert set(seen) == {tuple(sorted(p.items())) for p in points}


@pytest.mark.parametrize("name", sorted(n for n in SHIPPED if shipped(n).is_grid))
def test_shipped_grid_space_visits_every_point_once(name):
    check_grid_space(shipped(name))


def test_non_grid_spaces_have_grid_size_zero():
    for name in ("default", "heated_softmax", "ice", "smoke", "cub200", "cars196", "sop", "inshop"):
        space = shipped(name)
        assert not space.is_grid and space.grid_size() == 0


def test_grid_space_visits_every_point_once(tmp_path):
    path = write(
        tmp_path,
        {
            "fixed": {"loss": "ice", "dataset": "synthetic"},
            "grid": {"ice_scale": [1, 16, 32, 64, 80], "samples_per_class": [2, 4], "embedding_dim": [16, 32, 64]},
        },
    )
    space = load_space(path)
    assert space.grid_size() == 30
    check_grid_space(space)
    assert space.to_config({"ice_scale": 16, "samples_per_class": 2, "embedding_dim": 32})["loss"] == "ice"


# -- 2. conditional parameters in default.yaml ---------------------------------------------------

SOFTMAX_ONLY = {"alpha", "heating", "normalization", "weight_norm", "mean_proxy_weight"}
ALWAYS = {"loss", "classes_per_batch", "samples_per_class", "lr", "lr_schedule", "embedding_dim"}


@pytest.mark.parametrize(
    "make_sampler, n",
    [(lambda: optuna.samplers.RandomSampler(seed=11), 200), (lambda: optuna.samplers.TPESampler(seed=11), 60)],
    ids=["random", "tpe"],
)
def test_default_conditional_parameters(make_sampler, n):
    space = shipped("default")
    suggestions = sample(space, make_sampler(), n)
    losses = {s["loss"] for s in suggestions}
    assert losses == {"softmax", "ice"}
    heated = 0
    for s in suggestions:
        keys = set(s)
        assert ALWAYS <= keys
        if s["loss"] == "ice":
            assert keys == ALWAYS | {"ice_scale"}, keys
        else:
            assert "ice_scale" not in keys
            assert SOFTMAX_ONLY <= keys
            assert ("heating_target" in keys) == (s["heating"] != "none"), s
            if s["heating"] != "none":
                heated += 1
                assert 1 <= s["heating_target"] <= s["alpha"], s
    assert heated > 0


def test_default_heating_target_below_alpha_in_configs():
    space = shipped("default")
    heated = 0
    for s in sample(space, optuna.samplers.RandomSampler(seed=5), 300):
        config = TrainConfig.from_dict(space.to_config(s))
        if config.loss == "softmax" and config.heating != "none":
            heated += 1
            assert config.heating_target <= config.alpha
        if config.loss == "ice":
            assert config.samples_per_class >= 2
    assert heated > 50


def test_heated_softmax_conditions():
    space = shipped("heated_softmax")
    for s in sample(space, optuna.samplers.RandomSampler(seed=2), 200):
        heated = s["heating"] != "none"
        for key in ("heating_target", "heating_start", "heating_lr_factor"):
            assert (key in s) == heated
        if heated:
            assert s["heating_target"] <= s["alpha"]
            assert 0.5 <= s["heating_start"] <= 0.9


# -- 3. ranges from the papers ---------------------------------------------------------------------


def params(name: str) -> dict:
    return {p.name: p for p in shipped(name).params}


def test_default_ranges_from_the_papers():
    p = params("default")
    assert (p["alpha"].type, p["alpha"].low, p["alpha"].high, p["alpha"].log) == ("float", 2, 64, True)
    assert p["alpha"].when == {"loss": ("softmax",)}
    assert (p["ice_scale"].type, p["ice_scale"].low, p["ice_scale"].high, p["ice_scale"].log) == ("float", 4, 128, True)
    assert p["ice_scale"].when == {"loss": ("ice",)}
    assert set(p["samples_per_class"].choices) == {2, 3, 4, 5, 8}
    mpw = p["mean_proxy_weight"].choices
    assert 0 in mpw
    nonzero = [w for w in mpw if w != 0]
    assert nonzero and all(1e-3 <= w <= 1 for w in nonzero)
    assert min(nonzero) == pytest.approx(1e-3) and max(nonzero) == pytest.approx(1.0)
    assert p["heating_target"].high == {"param": "alpha"} and p["heating_target"].log
    assert set(p["loss"].choices) == {"softmax", "ice"}


def test_default_sampled_values_cover_the_ranges():
    space = shipped("default")
    suggestions = sample(space, optuna.samplers.RandomSampler(seed=3), 400)
    alphas = [s["alpha"] for s in suggestions if "alpha" in s]
    scales = [s["ice_scale"] for s in suggestions if "ice_scale" in s]
    assert 2 <= min(alphas) < 4 and 32 < max(alphas) <= 64
    assert 4 <= min(scales) < 8 and 64 < max(scales) <= 128
    assert {s["samples_per_class"] for s in suggestions} == {2, 3, 4, 5, 8}
    assert {s["classes_per_batch"] for s in suggestions} == {8, 16, 24, 32, 40, 48}
    weights = {s["mean_proxy_weight"] for s in suggestions if "mean_proxy_weight" in s}
    assert 0.0 in weights and len(weights) > 4


def test_ice_space_keeps_a_positive_per_anchor():
    p = params("ice")
    assert min(p["samples_per_class"].choices) >= 2
    assert (p["ice_scale"].low, p["ice_scale"].high, p["ice_scale"].log) == (4, 128, True)


# -- 4. paper_ablation.yaml: Table 1 of 000_4178e6910e81cd2f ------------------------------------------


def test_paper_ablation_variants():
    space = shipped("paper_ablation")
    assert list(space.variants) == ["SM", "LN", "BN", "HLN", "HBN"]
    assert space.grid_search_space() == {VARIANT: ["SM", "LN", "BN", "HLN", "HBN"]}
    assert space.grid_size() == 5
    cfg = {name: TrainConfig.from_dict(space.to_config({VARIANT: name})) for name in space.variants}
    sm = cfg["SM"]
    assert (sm.normalization, sm.weight_norm, sm.alpha, sm.heating) == ("none", False, 1.0, "none")
    for name, norm in (("LN", "l2"), ("BN", "bn")):
        c = cfg[name]
        assert (c.normalization, c.weight_norm, c.alpha, c.heating) == (norm, True, 16.0, "none")
    for name, norm in (("HLN", "l2"), ("HBN", "bn")):
        c = cfg[name]
        assert (c.normalization, c.weight_norm, c.heating) == (norm, True, "two_stage")
        assert (c.alpha, c.heating_target) == (16.0, 4.0)
        assert (c.heating_start, c.heating_lr_factor) == (0.75, 0.1)
    assert all(c.loss == "softmax" and c.embedding_dim == 64 for c in cfg.values())
    assert len({(c.normalization, c.weight_norm, c.alpha, c.heating) for c in cfg.values()}) == 5


# -- 5. the loader's error catalogue ---------------------------------------------------------------

P = "params:\n  "
LR = P + "lr: {type: float, low: 0.001, high: 0.01}\n"  # a minimal valid params section
CATALOGUE = [
    # (id, file text, substrings the message must contain)
    ("yaml_syntax_flow", "params: {loss: [softmax, ice\n", ["YAML syntax error"]),
    ("top_level_list", "- loss\n- alpha\n", ["expected a mapping"]),
    ("top_level_scalar", "just a string\n", ["expected a mapping"]),
    ("empty_file", "", ["expected a mapping"]),
    ("unknown_top_level", "parms:\n  lr: {type: float, low: 0.001, high: 0.01}\n", ["parms", "unknown top-level key"]),
    ("unknown_param", P + "alhpa: {type: float, low: 2, high: 64}\n", ["params.alhpa", "unknown parameter"]),
    ("param_variant_is_not_a_key", P + "variant: {type: categorical, choices: [a, b]}\n", ["params.variant"]),
    ("wrong_type", P + "alpha: {type: floaty, low: 2, high: 64}\n", ["params.alpha.type", "floaty"]),
    ("missing_type", P + "alpha: {low: 2, high: 64}\n", ["params.alpha.type"]),
    ("low_string", P + "alpha: {type: float, low: '2', high: 64}\n", ["params.alpha.low", "not a number"]),
    ("low_1e-3_is_a_yaml_string", P + "lr: {type: float, low: 1e-4, high: 0.01}\n", ["params.lr.low"]),
    ("high_bool", P + "alpha: {type: float, low: 2, high: true}\n", ["params.alpha.high"]),
    ("int_low_not_integer", P + "classes_per_batch: {type: int, low: 2.5, high: 8}\n", ["params.classes_per_batch.low", "integer"]),
    ("missing_high", P + "alpha: {type: float, low: 2}\n", ["params.alpha.high", "missing"]),
    ("low_above_high", P + "alpha: {type: float, low: 64, high: 2}\n", ["params.alpha", "low=64"]),
    ("log_low_zero", P + "lr: {type: float, low: 0, high: 0.01, log: true}\n", ["params.lr.low", "log"]),
    ("log_low_negative", P + "lr: {type: float, low: -1, high: 0.01, log: true}\n", ["params.lr.low", "log"]),
    ("log_not_bool", P + "lr: {type: float, low: 0.001, high: 0.01, log: 1}\n", ["params.lr.log"]),
    ("empty_choices", P + "loss: {type: categorical, choices: []}\n", ["params.loss.choices", "non-empty"]),
    ("choices_not_a_list", P + "loss: {type: categorical, choices: softmax}\n", ["params.loss.choices"]),
    ("choices_nested", P + "loss: {type: categorical, choices: [[softmax], ice]}\n", ["params.loss.choices", "scalar"]),
    ("key_not_allowed_for_type", P + "alpha: {type: float, low: 2, high: 64, choices: [2, 4]}\n", ["params.alpha.choices", "not allowed"]),
    ("when_unknown_param", P + "alpha: {type: float, low: 2, high: 64, when: {losss: softmax}}\n", ["params.alpha.when.losss"]),
    (
        "when_on_later_param",
        P + "alpha: {type: float, low: 2, high: 64, when: {loss: softmax}}\n  loss: {type: categorical, choices: [softmax, ice]}\n",
        ["params.alpha.when.loss", "earlier"],
    ),
    ("when_not_a_mapping", P + "alpha: {type: float, low: 2, high: 64, when: softmax}\n", ["params.alpha.when"]),
    (
        "bound_missing_param",
        P + "heating_target: {type: float, low: 1, high: {param: alpha}}\n",
        ["params.heating_target.high", "{param: NAME}"],
    ),
    (
        "bound_malformed",
        P + "alpha: {type: float, low: 2, high: 64}\n  heating_target: {type: float, low: 1, high: {param: alpha, scale: 2}}\n",
        ["params.heating_target.high"],
    ),
    ("step_with_log", P + "alpha: {type: float, low: 2, high: 64, log: true, step: 2}\n", ["params.alpha.step", "log"]),
    ("step_not_positive", P + "classes_per_batch: {type: int, low: 8, high: 48, step: 0}\n", ["params.classes_per_batch.step"]),
    ("params_and_grid", P + "alpha: {type: float, low: 2, high: 64}\ngrid:\n  lr: [0.001, 0.01]\n", ["params", "grid", "exactly one"]),
    ("grid_and_variants", "grid:\n  lr: [0.001]\nvariants:\n  A: {lr: 0.01}\n", ["grid", "variants", "exactly one"]),
    ("nothing_searched", "fixed:\n  epochs: 3\n", ["params", "grid", "variants", "exactly one"]),
    ("params_not_a_mapping", "params:\n  - alpha\n", ["params", "mapping"]),
    ("fixed_not_a_mapping", "fixed: [epochs]\n" + P + "lr: {type: float, low: 0.001, high: 0.01}\n", ["fixed", "mapping"]),
    ("fixed_unknown_key", "fixed:\n  epoch: 3\n" + P + "lr: {type: float, low: 0.001, high: 0.01}\n", ["fixed.epoch", "unknown"]),
    ("fixed_and_searched", "fixed:\n  alpha: 16\n" + P + "alpha: {type: float, low: 2, high: 64}\n", ["params.alpha", "fixed"]),
    ("fixed_value_rejected", "fixed:\n  epochs: 0\n" + P + "lr: {type: float, low: 0.001, high: 0.01}\n", ["epochs"]),
    (
        "ice_with_one_sample_per_class",
        "fixed:\n  loss: ice\n" + P + "samples_per_class: {type: categorical, choices: [1, 2]}\n",
        ["samples_per_class", "ice"],
    ),
    (
        "heating_target_above_alpha",
        "fixed:\n  heating_target: 10\n  heating: two_stage\n" + P + "alpha: {type: float, low: 2, high: 8}\n",
        ["heating_target"],
    ),
    ("choice_value_rejected", P + "normalization: {type: categorical, choices: [bn, layer]}\n", ["normalization", "layer"]),
    ("int_param_as_float", P + "classes_per_batch: {type: float, low: 8, high: 48}\n", ["classes_per_batch"]),
    ("grid_value_out_of_range", "grid:\n  alpha: [0, 16]\n", ["alpha"]),
    ("grid_unknown_key", "grid:\n  alhpa: [1, 16]\n", ["grid.alhpa"]),
    ("grid_values_not_a_list", "grid:\n  alpha: 16\n", ["grid.alpha", "list"]),
    ("grid_values_empty", "grid:\n  alpha: []\n  lr: [0.001]\n", ["grid.alpha", "non-empty"]),
    ("variants_not_a_mapping", "variants: [SM, LN]\n", ["variants", "mapping"]),
    ("variant_not_a_mapping", "variants:\n  SM: 1\n", ["variants.SM"]),
    ("variant_unknown_key", "variants:\n  SM: {alhpa: 1}\n", ["alhpa", "SM"]),
    ("final_budget_below_one", "final_budget_factor: 0.5\n" + LR, ["final_budget_factor", "0.5", "[1, 100]"]),
    ("final_budget_not_a_number", "final_budget_factor: twice\n" + LR, ["final_budget_factor", "'twice'"]),
    ("final_budget_nan", "final_budget_factor: .nan\n" + LR, ["final_budget_factor", "nan"]),
    ("variant_value_rejected", "variants:\n  SM: {normalization: layer}\n  BN: {normalization: bn}\n", ["normalization", "layer", "SM"]),
]


@pytest.mark.parametrize("text, expected", [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
def test_loader_error_catalogue(tmp_path, text, expected):
    path = write(tmp_path, text, "bad space.yaml")
    with pytest.raises(UsageError) as info:
        load_space(path)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert str(path) in message
    assert "\n" not in message
    for part in expected:
        assert part in message, (part, message)


def test_catalogue_is_large_enough():
    assert len({c[0] for c in CATALOGUE}) == len(CATALOGUE) >= 20


@pytest.mark.parametrize(
    "text, expected",
    [c[1:] for c in CATALOGUE if not c[0].startswith("yaml")],
    ids=[c[0] for c in CATALOGUE if not c[0].startswith("yaml")],
)
def test_loader_errors_are_space_errors(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(SpaceError):
        load_space(path)


def test_space_error_is_a_value_error():
    assert issubclass(SpaceError, ValueError) and issubclass(SpaceError, UsageError)


@pytest.mark.parametrize("text", ["params: {loss: [softmax, ice\n", None], ids=["yaml_syntax", "missing_file"])
def test_unparseable_file_raises_space_error(tmp_path, text):
    path = write(tmp_path, text) if text is not None else tmp_path / "missing.yaml"
    with pytest.raises(SpaceError):
        load_space(path)


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = write(tmp_path, "params:\n  alpha: {type: float, low: 2, high: 64\n")
    with pytest.raises(UsageError) as info:
        load_space(path)
    assert f"{path}:" in str(info.value) and "YAML syntax error" in str(info.value)


def test_bare_name_that_is_not_shipped(tmp_path):
    with pytest.raises(UsageError, match="nonexistent_space"):
        load_space("nonexistent_space")


def test_bound_on_inactive_parameter_is_a_space_error(tmp_path):
    path = write(
        tmp_path,
        P + "loss: {type: categorical, choices: [softmax, ice]}\n"
        "  alpha: {type: float, low: 2, high: 64, when: {loss: softmax}}\n"
        "  heating_target: {type: float, low: 1, high: {param: alpha}}\n",
    )
    with pytest.raises(SpaceError, match="heating_target"):
        load_space(path)


def test_referenced_bound_below_low_is_a_space_error(tmp_path):
    path = write(tmp_path, P + "alpha: {type: float, low: 0.5, high: 2}\n  heating_target: {type: float, low: 1, high: {param: alpha}}\n")
    with pytest.raises(SpaceError) as info:
        load_space(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_referenced_bound_below_low_names_the_parameter(tmp_path):
    path = write(tmp_path, P + "alpha: {type: float, low: 0.5, high: 2}\n  heating_target: {type: float, low: 1, high: {param: alpha}}\n")
    with pytest.raises(SpaceError, match="heating_target"):
        load_space(path)


def test_shorthand_choices_and_fixed_references(tmp_path):
    path = write(
        tmp_path,
        "fixed:\n  alpha: 16\n  loss: softmax\n" + P + "normalization: [l2, bn]\n"
        "  embedding_dim: 64\n  heating_target: {type: float, low: 1, high: {param: alpha}, log: true}\n",
    )
    space = load_space(path)
    p = {q.name: q for q in space.params}
    assert p["normalization"].choices == ("l2", "bn") and p["embedding_dim"].choices == (64,)
    for s in sample(space, optuna.samplers.RandomSampler(seed=0), 50):
        assert 1 <= s["heating_target"] <= 16 and s["embedding_dim"] == 64


# -- 6. max_classes_per_batch ----------------------------------------------------------------------

DEFAULT_C = TrainConfig().classes_per_batch


@pytest.mark.parametrize("name, expected", [("default", 48), ("heated_softmax", 48), ("ice", 48), ("smoke", 8), ("paper_ablation", 32)])
def test_max_classes_per_batch_shipped(name, expected):
    space = shipped(name)
    assert max_classes_per_batch(space) == expected
    seen = [TrainConfig.from_dict(space.to_config(s)).classes_per_batch for s in sample(space, optuna.samplers.RandomSampler(seed=1), 300)]
    assert max(seen) == expected


MAX_C_CASES = [
    ("int_high", {"params": {"classes_per_batch": {"type": "int", "low": 4, "high": 20, "step": 4}}}, 20),
    ("int_no_step", {"params": {"classes_per_batch": {"type": "int", "low": 3, "high": 17}}}, 17),
    ("categorical", {"params": {"classes_per_batch": {"type": "categorical", "choices": [8, 24, 16]}}}, 24),
    ("shorthand_list", {"params": {"classes_per_batch": [12, 6]}}, 12),
    ("grid", {"grid": {"classes_per_batch": [4, 12], "lr": [0.001, 0.01]}}, 12),
    ("grid_without_c", {"fixed": {"classes_per_batch": 10}, "grid": {"lr": [0.001, 0.01]}}, 10),
    ("variants_all_set", {"variants": {"A": {"classes_per_batch": 40}, "B": {"classes_per_batch": 8}}}, 40),
    ("variants_some_fixed", {"fixed": {"classes_per_batch": 64}, "variants": {"A": {"classes_per_batch": 8}, "B": {}}}, 64),
    ("variants_some_default", {"variants": {"A": {"classes_per_batch": 8}, "B": {"lr": 0.01}}}, DEFAULT_C),
    ("variants_none_set", {"variants": {"A": {"lr": 0.01}, "B": {"lr": 0.1}}}, DEFAULT_C),
    ("fixed", {"fixed": {"classes_per_batch": 20}, "params": {"lr": {"type": "float", "low": 0.001, "high": 0.01}}}, 20),
    ("default", {"params": {"lr": {"type": "float", "low": 0.001, "high": 0.01}}}, DEFAULT_C),
]


def reachable_max(space: Space) -> int:
    if space.is_grid:
        points = grid_points(space)
    else:
        points = sample(space, optuna.samplers.RandomSampler(seed=4), 300)
    return max(TrainConfig.from_dict(space.to_config(p)).classes_per_batch for p in points)


@pytest.mark.parametrize("spec, expected", [c[1:] for c in MAX_C_CASES], ids=[c[0] for c in MAX_C_CASES])
def test_max_classes_per_batch(tmp_path, spec, expected):
    space = load_space(write(tmp_path, spec))
    assert max_classes_per_batch(space) == expected
    assert reachable_max(space) == expected


def test_max_classes_per_batch_conditional_param(tmp_path):
    space = load_space(
        write(
            tmp_path,
            {
                "params": {
                    "loss": {"type": "categorical", "choices": ["softmax", "ice"]},
                    "classes_per_batch": {"type": "int", "low": 4, "high": 8, "when": {"loss": "ice"}},
                }
            },
        )
    )
    assert reachable_max(space) == DEFAULT_C
    assert max_classes_per_batch(space) == DEFAULT_C


def test_max_classes_per_batch_string_choices(tmp_path):
    space = load_space(write(tmp_path, {"params": {"classes_per_batch": {"type": "categorical", "choices": ["8", "16"]}}}))
    assert reachable_max(space) == 16
    assert max_classes_per_batch(space) == 16


@pytest.mark.filterwarnings("ignore:The distribution is specified by")
def test_max_classes_per_batch_step_not_dividing(tmp_path):
    space = load_space(write(tmp_path, {"params": {"classes_per_batch": {"type": "int", "low": 8, "high": 50, "step": 8}}}))
    assert reachable_max(space) == 48
    assert max_classes_per_batch(space) == 48


def test_check_dataset_synthetic(tmp_path):
    # synthetic: 30 training classes, val_fraction 0.2 -> 24 fit classes and 30 // 6 = 5 validation folds; smoke reaches C = 8
    assert check_dataset(shipped("smoke"), None) == (24, 5)
    too_big = load_space(
        write(
            tmp_path,
            {
                "fixed": {"dataset": "synthetic", "samples_per_class": 2},
                "params": {"classes_per_batch": {"type": "int", "low": 8, "high": 32, "step": 8}},
            },
        )
    )
    with pytest.raises(SpaceError) as info:
        check_dataset(too_big, None)
    message = str(info.value)
    assert "classes_per_batch" in message and "32" in message and "24" in message and "synthetic" in message


# -- 7. parse_args and prepare_space ---------------------------------------------------------------

BAD_FLAGS = [
    (["--num-samples", "0"], "--num-samples"),
    (["--num-samples", "-3"], "--num-samples"),
    (["--max-concurrent", "0"], "--max-concurrent"),
    (["--cpus-per-trial", "0"], "--cpus-per-trial"),
    (["--cpus-per-trial", "nan"], "--cpus-per-trial"),
    (["--gpus-per-trial", "-1"], "--gpus-per-trial"),
    (["--epochs", "0"], "--epochs"),
    (["--grace-period", "0"], "--grace-period"),
    (["--reduction-factor", "1"], "--reduction-factor"),
    (["--reduction-factor", "0.5"], "--reduction-factor"),
    (["--metric", "val_foo"], "--metric"),
    (["--max-failures", "-1"], "--max-failures"),
    (["--checkpoint-every", "-1"], "--checkpoint-every"),
    (["--checkpoint-every", "inf"], "--checkpoint-every"),
    (["--study-name", "a/b"], "--study-name"),
    (["--study-name", "../x"], "--study-name"),
    (["--study-name", "x..y"], "--study-name"),
    (["--study-name", ".."], "--study-name"),
    (["--study-name=-x"], "--study-name"),
    (["--study-name", "-x"], "--study-name"),
    (["--study-name", ""], "--study-name"),
    (["--study-name", "a b"], "--study-name"),
    (["--study-name", "x" * 101], "--study-name"),
    (["--resume"], "--resume"),
    (["--num-samples", "many"], "--num-samples"),
]


@pytest.mark.parametrize("argv, flag", BAD_FLAGS, ids=[" ".join(a)[:40] for a, _ in BAD_FLAGS])
def test_parse_args_rejects(capsys, argv, flag):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and flag in err, err


def test_parse_args_rejects_nan_gpus(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--gpus-per-trial", "nan"])
    assert "--gpus-per-trial" in capsys.readouterr().err


def test_parse_args_accepts_good_flags():
    args = parse_args(
        [
            "--space",
            "smoke",
            "--num-samples",
            "4",
            "--max-concurrent",
            "1",
            "--gpus-per-trial",
            "0.25",
            "--study-name",
            "a.b-c_1",
            "--resume",
            "--metric",
            "val_map_at_r",
            "--reduction-factor",
            "2",
            "--grace-period",
            "1",
            "--epochs",
            "3",
        ]
    )
    assert (args.num_samples, args.max_concurrent, args.gpus_per_trial, args.study_name) == (4, 1, 0.25, "a.b-c_1")
    assert args.resume and args.metric == "val_map_at_r"
    defaults = parse_args([])
    assert defaults.space is None and defaults.num_samples is None and defaults.metric in launch.METRICS


def test_prepare_space_overrides(tmp_path):
    space = prepare_space(parse_args(["--space", "smoke", "--epochs", "2"]))
    assert space.fixed["epochs"] == 2 and space.fixed["dataset"] == "synthetic"
    assert TrainConfig.from_dict(space.to_config({"loss": "ice"})).epochs == 2
    space = prepare_space(parse_args(["--space", "paper_ablation", "--dataset", "synthetic", "--epochs", "3"]))
    assert all(TrainConfig.from_dict(space.to_config({VARIANT: v})).dataset == "synthetic" for v in space.variants)
    unchanged = prepare_space(parse_args(["--space", "default"]))
    assert unchanged.fixed == shipped("default").fixed and unchanged.path == str(SHIPPED["default"])


def test_prepare_space_rejects_clashes_and_bad_overrides(tmp_path):
    searched = write(tmp_path, {"params": {"epochs": {"type": "int", "low": 2, "high": 6}}}, "searched.yaml")
    with pytest.raises(SpaceError, match="epochs"):
        prepare_space(parse_args(["--space", str(searched), "--epochs", "3"]))
    grid = write(tmp_path, {"grid": {"dataset": ["synthetic", "omniglot"]}}, "grid.yaml")
    with pytest.raises(SpaceError, match="dataset"):
        prepare_space(parse_args(["--space", str(grid), "--dataset", "synthetic"]))
    with pytest.raises(SpaceError, match="dataset"):
        prepare_space(parse_args(["--space", "smoke", "--dataset", "mnist"]))


def test_prepare_space_variant_clash(tmp_path):
    path = write(tmp_path, {"variants": {"A": {"epochs": 3}, "B": {"lr": 0.01}}})
    try:
        space = prepare_space(parse_args(["--space", str(path), "--epochs", "5"]))
    except SpaceError:
        return
    assert all(TrainConfig.from_dict(space.to_config({VARIANT: v})).epochs == 5 for v in space.variants)


def test_numbers_are_finite_in_shipped_fixed():
    for path in SHIPPED.values():
        for value in load_space(path).fixed.values():
            if isinstance(value, float):
                assert math.isfinite(value)


def test_final_budget_factor_scales_the_final_epochs_only(tmp_path):
    """final_epochs = factor x the trials' epochs, rounded half up, never below them; the trials' config keeps its epochs."""
    scaled = load_space(write(tmp_path, "fixed: {epochs: 3}\nfinal_budget_factor: 1.5\n" + LR))
    assert [scaled.final_epochs(e) for e in (3, 10, 16)] == [5, 15, 24]  # 4.5 -> 5 (half up), by hand
    plain = load_space(write(tmp_path, LR, "plain.yaml"))
    assert plain.final_budget_factor == 1.0 and plain.final_epochs(7) == 7
    default = load_space("default")
    assert default.final_epochs(default.fixed["epochs"]) == 32  # 2 x 16, chosen on the validation classes (docs/findings.md)
    assert all(load_space(name).final_epochs(4) == 4 for name in ("smoke", "ice"))


def test_race_folds_of_whole_alphabets_need_alphabets():
    """--race-folds alphabets on generated glyphs (no alphabet names) is one line naming the flag; on Omniglot's 5
    training alphabets of this data (Greek 24, Latin 26, Korean 40, Balinese 24, Early Aramaic 22 characters, in the
    seeded order) the default's val_fraction 0.3 (40.8 characters a fold) gives 3 folds of whole alphabets, whatever
    the trials' own split: Greek + Latin (50 is nearer 40.8 than 24), Korean (40), Balinese + Early Aramaic (46)."""
    with pytest.raises(UsageError) as info:
        check_dataset(shipped("smoke"), None, "alphabets")
    assert "--race-folds alphabets" in str(info.value) and "\n" not in str(info.value)
    from tests.conftest import omniglot_root

    if omniglot_root() is None:
        pytest.skip("no real Omniglot under shared/data or $DML_DATA_ROOT")
    assert check_dataset(shipped("default"), str(omniglot_root()), "alphabets") == (95, 3)  # 136 - round(40.8) fit
    assert check_dataset(shipped("default"), str(omniglot_root())) == (95, 3)  # 136 // 41 class folds
