"""Trials packed on a GPU must fit its memory (study.checks.packing_problem; issue 60, item 3).

The figures are worked by hand from study.checks.STEP_PEAK_GIB (GoogLeNet in bf16: 5.8 GiB at 180 images of 224 px)
and PROCESS_GIB (0.9 GiB a trial's process); the GPU is an A10G, cluster.yaml's worker (24 GB, 22.4 GiB). No Ray
starts: the refusal comes before it.
"""

from __future__ import annotations

import subprocess

import mlflow
import pytest
import ray

from study import checks
from study.launch import cli as launch
from study.launch.settings import check_gpu_packing, largest
from study.search.spaces import load_space

A10G = checks.Gpu("NVIDIA A10G", 24e9 / 2**30)


def test_a_trials_memory_scales_its_measured_step_by_its_images_and_pixels():
    cub = checks.TrialShape("googlenet", "bf16", 16, 10, 224)  # cub200's largest batch
    assert cub.gpu_gib() == pytest.approx(5.8 * 160 / 180 + 0.9)  # 6.06
    half_size = checks.TrialShape("resnet50", "fp32", 60, 3, 112)
    assert half_size.gpu_gib() == pytest.approx(15.4 / 4 + 0.9)
    assert checks.TrialShape("resnet18", "bf16", 60, 3, 224).gpu_gib() is None  # not measured: not checked


def test_a_packing_that_cannot_fit_is_refused_with_its_numbers():
    cub = checks.TrialShape("googlenet", "bf16", 16, 10, 224)
    assert checks.packing_problem("cub200", cub, 1 / 3, A10G) is None  # 3 x 6.06 = 18.2 <= 22.4
    problem = checks.packing_problem("cub200", cub, 0.25, A10G)  # 4 x 6.06 = 24.2 > 22.4
    assert problem is not None and "\n" not in problem
    for needle in ("--gpus-per-trial 0.25: 4 trial(s) of cub200", "22.4 GiB (NVIDIA A10G)", "4 x 6.1 = 24.2 GiB", "16 x 10 = 160 images"):
        assert needle in problem, (needle, problem)
    assert "expected --gpus-per-trial 0.333 or more (at most 3 trial(s) a GPU)" in problem
    assert checks.packing_problem("cub200", cub, 2, checks.Gpu("small", 4.0)).endswith("one trial alone does not fit")


def test_the_presets_pack_on_an_a10g_as_docs_say():
    """docs/guide/clusters.md's table: cub200 and cars196 3 trials an A10G, sop and inshop 2."""
    for name, fits in (("cub200", 3), ("cars196", 3), ("sop", 2), ("inshop", 2)):
        space = load_space(name)
        check_gpu_packing(space, 1 / fits, [A10G])
        with pytest.raises(checks.UsageError, match=f"at most {fits} trial"):
            check_gpu_packing(space, 1 / (fits + 1), [A10G])
    assert (largest(load_space("sop"), "classes_per_batch"), largest(load_space("sop"), "samples_per_class")) == (90, 3)


def test_the_gpus_are_read_from_nvidia_smi(monkeypatch):
    answer = subprocess.CompletedProcess([], 0, stdout="NVIDIA A10G, 23028\nNVIDIA H200, 143771\n", stderr="")
    monkeypatch.setattr(checks.subprocess, "run", lambda *a, **k: answer)
    assert checks.local_gpus() == [checks.Gpu("NVIDIA A10G", 23028 / 1024), checks.Gpu("NVIDIA H200", 143771 / 1024)]

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(checks.subprocess, "run", missing)
    assert checks.local_gpus() == []


def test_launch_refuses_the_packing_in_one_line_before_ray_starts(runs, capsys, monkeypatch):
    monkeypatch.setattr(checks, "local_gpus", lambda: [checks.Gpu("NVIDIA A10G", 23028 / 1024)])
    code = launch.main(["--space", "sop", "--gpus-per-trial", "0.25", "--cpus-per-trial", "1", "--study-name", "packed"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error:") and "\n" not in err, err
    assert "--gpus-per-trial 0.25: 4 trial(s) of" in err and "sop.yaml" in err and "4 x 9.6 = 38.4 GiB" in err, err
    assert "expected --gpus-per-trial 0.5 or more (at most 2 trial(s) a GPU)" in err
    assert not ray.is_initialized()
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []
