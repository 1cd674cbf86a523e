"""The final model serves: input rules of the pyfunc model, what study.final logs with it, and `mlflow models serve` end to end."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from study.final import cli as final
from study.final import pyfunc
from study.final.images import IMAGE_INPUT_RULES, as_uint8_images
from study.final.serving import serve_commands
from tests.conftest import omniglot_root, recorded_params
from tests.test_final import TINY
from trainables.core.checkpoint import save_bundle
from trainables.core.config import TrainConfig
from trainables.core.data import synthetic_glyphs
from trainables.core.engine import build_model
from trainables.core.transforms import preprocess_batch

# -- input rules: as_uint8_images ------------------------------------------------------------------------------------


def test_integer_and_bool_values_become_uint8():
    pixels = np.array([[0, 17], [128, 255]])
    for dtype in (np.int64, np.int32, np.uint16, np.int16):
        out = as_uint8_images(pixels.astype(dtype))
        assert out.dtype == np.uint8 and out.shape == (1, 2, 2)
        np.testing.assert_array_equal(out[0], pixels)
    out = as_uint8_images(np.array([[True, False], [False, True]]))
    np.testing.assert_array_equal(out[0], [[255, 0], [0, 255]])  # True is white, as Omniglot's mode "1" PNGs read


def test_floats_up_to_one_are_scaled_by_255_and_larger_floats_kept():
    np.testing.assert_array_equal(as_uint8_images(np.array([[0.0, 0.5, 1.0]] * 2))[0], [[0, 128, 255]] * 2)
    np.testing.assert_array_equal(as_uint8_images(np.array([[0.0, 127.6, 255.0]] * 2))[0], [[0, 128, 255]] * 2)
    # one scale for the whole batch: an image whose own maximum is 1 is not rescaled when another exceeds 1
    batch = as_uint8_images(np.stack([np.full((2, 2), 1.0), np.full((2, 2), 200.0)]))
    assert batch[0].max() == 1 and batch[1].max() == 200


@pytest.mark.parametrize(
    "values, needle",
    [
        (np.array([[0, 256]] * 2), "values from 0 to 256"),
        (np.array([[-1, 3]] * 2), "values from -1 to 3"),
        (np.array([[0.5, np.nan]] * 2), "NaN"),
        (np.array([["a", "b"]] * 2), "<U1 values"),
        (np.zeros((4,), np.uint8), "shape (4,)"),
        (np.zeros((2, 3, 8, 8), np.uint8), "shape (2, 3, 8, 8)"),  # channels first
        (np.zeros((2, 8, 8, 2), np.uint8), "shape (2, 8, 8, 2)"),
        (np.zeros((1, 2, 8, 8, 3), np.uint8), "shape (1, 2, 8, 8, 3)"),
        ({"pixels": [1, 2]}, "got dict"),
    ],
)
def test_bad_input_is_one_line_naming_what_came_and_what_is_expected(values, needle):
    with pytest.raises(ValueError) as caught:
        as_uint8_images(values)
    message = str(caught.value)
    assert needle in message and message.endswith(IMAGE_INPUT_RULES) and "\n" not in message


def test_shapes_single_images_and_the_channel_rule():
    assert as_uint8_images(np.zeros((20, 30), np.uint8)).shape == (1, 20, 30)  # one gray image
    assert as_uint8_images(np.zeros((32, 32, 3), np.uint8)).shape == (1, 32, 32, 3)  # one RGB image, not 32 images
    assert as_uint8_images(np.zeros((32, 32, 4), np.uint8)).shape == (1, 32, 32, 4)
    assert as_uint8_images(np.zeros((32, 32, 1), np.uint8)).shape == (1, 32, 32, 1)
    assert as_uint8_images(np.zeros((5, 32, 32), np.uint8)).shape == (5, 32, 32)  # last axis not 1, 3, 4: a batch
    assert as_uint8_images(np.zeros((5, 32, 32, 3), np.uint8)).shape == (5, 32, 32, 3)
    assert as_uint8_images(np.zeros((0, 32, 32), np.uint8)).shape == (0, 32, 32)


def test_json_forms_nested_lists_object_arrays_and_ragged_images():
    image = [[0, 255, 0, 9, 9], [255, 0, 255, 9, 9]]
    out = as_uint8_images(np.array([image, image], dtype=object))  # what MLflow's server hands over for {"inputs": [...]}
    assert out.dtype == np.uint8 and out.shape == (2, 2, 5)
    ragged = as_uint8_images(np.array([image, [[1.0] * 6] * 4], dtype=object))  # two sizes in one request
    assert [x.shape for x in ragged] == [(2, 5), (4, 6)] and ragged[1].max() == 255
    assert as_uint8_images([image, image]).shape == (2, 2, 5)


def test_pil_images_of_any_mode_and_size():
    gray = Image.fromarray(np.array([[0, 255], [128, 64]], np.uint8))
    binary = gray.convert("1")  # Omniglot's PNGs open in this mode
    out = as_uint8_images([binary, gray.convert("RGB"), gray.convert("P"), gray.resize((5, 3))])
    assert isinstance(out, list) and [x.dtype for x in out] == [np.uint8] * 4
    np.testing.assert_array_equal(out[0], np.asarray(binary.convert("L")))
    assert out[1].shape == (2, 2, 3) and out[2].shape == (2, 2, 3) and out[3].shape == (3, 5)
    np.testing.assert_array_equal(as_uint8_images(gray)[0], np.asarray(gray))
    with pytest.raises(ValueError, match="image 0 of the list: an array of uint16"):
        as_uint8_images([Image.fromarray(np.full((2, 2), 1000, np.uint16))])


def test_preprocess_batch_takes_a_list_of_sizes():
    images = [np.zeros((10, 12), np.uint8), np.zeros((40, 30, 3), np.uint8)]
    assert preprocess_batch(images, "characters", 16).shape == (2, 1, 16, 16)
    with pytest.raises(ValueError, match="image 1: expected a uint8 array"):
        preprocess_batch([images[0], images[0].astype(float)], "characters", 16)


# -- the pyfunc model, loaded from a bundle without MLflow's tracking ------------------------------------------------


def embedding_model(tmp_path: Path, kind: str) -> pyfunc.EmbeddingModel:
    config = TrainConfig.from_dict({**TINY, "seed": 0})
    torch.manual_seed(0)
    net = build_model(config, kind, 32)
    bundle = {"config": config.to_dict(), "epoch": 0, "model": net.state_dict(), "kind": kind, "image_size": 32}
    path = save_bundle(bundle, tmp_path / f"{kind}.pt")
    model = pyfunc.EmbeddingModel()
    model.load_context(mlflow.pyfunc.PythonModelContext(artifacts={"bundle": str(path)}, model_config=None))
    return model


def test_every_accepted_form_of_the_same_images_gives_the_same_embeddings(tmp_path):
    model = embedding_model(tmp_path, "characters")
    glyphs, _ = synthetic_glyphs(3, 1, 40, seed=5)  # uint8 (3, 40, 40)
    reference = model.predict(None, glyphs)
    assert reference.dtype == np.float32 and reference.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)
    rgb = np.repeat(glyphs[..., None], 3, axis=-1)
    rgba = np.concatenate([rgb, np.full((3, 40, 40, 1), 7, np.uint8)], axis=-1)  # alpha dropped
    forms = {
        "int64": glyphs.astype(np.int64),
        "float [0, 1]": glyphs / 255.0,
        "float [0, 255]": glyphs.astype(np.float32),
        "RGB": rgb,
        "RGBA": rgba,
        "PIL list": [Image.fromarray(g) for g in glyphs],
        "MLflow's dict": {"images": np.array(glyphs.tolist(), dtype=object)},
    }
    for name, form in forms.items():
        np.testing.assert_allclose(model.predict(None, form), reference, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(model.predict(None, rgb[0]), reference[:1], atol=1e-5)  # one (H, W, 3) image
    assert model.predict(None, np.zeros((0, 40, 40), np.uint8)).shape == (0, 16)


def test_gray_input_to_an_rgb_model_is_replicated(tmp_path):
    model = embedding_model(tmp_path, "photos")
    gray = np.random.default_rng(0).integers(0, 256, (2, 36, 36), dtype=np.uint8)
    np.testing.assert_allclose(model.predict(None, gray), model.predict(None, np.repeat(gray[..., None], 3, -1)), atol=1e-5)


def test_bad_payload_is_a_valueerror_and_an_http_400(tmp_path):
    model = embedding_model(tmp_path, "characters")
    with pytest.raises(ValueError) as caught:
        model.predict(None, np.full((2, 8, 8), 300))
    error = caught.value
    assert isinstance(error, mlflow.exceptions.MlflowException) and error.get_http_status_code() == 400
    assert "values from 300 to 300" in error.message and "\n" not in error.message


# -- what is logged with the model, and what study.final prints ------------------------------------------------------


def test_signature_and_pinned_requirements():
    signature = pyfunc.signature(16)
    assert signature.inputs.input_names() == ["images"] and signature.outputs.inputs[0].shape == (-1, 16)
    pins = dict(line.split("==") for line in pyfunc.pinned_requirements())
    assert set(pins) == set(pyfunc.REQUIREMENTS)
    assert pins["numpy"] == np.__version__ and pins["mlflow"] == mlflow.__version__
    assert pins["torch"] == metadata.version("torch").split("+")[0]


def test_version_description_names_origin_metrics_and_config():
    config = TrainConfig.from_dict(TINY)
    text = pyfunc.version_description(config, {"test_recall_at_1": 0.91234}, "study s1 (parent run abc)", "run123")
    assert "study s1 (parent run abc)" in text and "run123" in text and "| recall_at_1 | 0.9123 |" in text
    assert yaml.safe_load(text.split("```yaml\n")[1].split("```")[0]) == config.to_dict()


def test_a_tie_is_described_as_one_model_of_named_members_with_their_own_scores():
    """The race's tie registered as one model: each member named, the pick marked, the members' own test scores and
    their mean (written out here) beside the model's, each config with only the keys it trained with."""
    pick = TrainConfig.from_dict({**TINY, "loss": "softmax", "seed": 0})
    other = TrainConfig.from_dict({**TINY, "loss": "ice", "ice_scale": 32.0, "seed": 1})
    test = {"test_recall_at_1": 0.9, "test_map_at_r": 0.5}
    members = [{"test_recall_at_1": 0.8, "test_map_at_r": 0.4}, {"test_recall_at_1": 0.7, "test_map_at_r": 0.45}]
    text = pyfunc.version_description(pick, test, "study s1", "run9", [0, 1], [(14, pick), (3, other)], members)
    assert "the study's tied candidates Optuna #14 (the pick, seed 0), Optuna #3 (seed 1) as one model" in text
    assert "| metric | this model | #14 alone (the pick) | #3 alone | members' mean |" in text
    assert "| recall_at_1 | 0.9000 | 0.8000 | 0.7000 | 0.7500 |" in text and "| map_at_r | 0.5000 | 0.4000 | 0.4500 | 0.4250 |" in text
    blocks = [yaml.safe_load(part.split("```")[0]) for part in text.split("```yaml\n")[1:]]
    assert [b["loss"] for b in blocks] == ["softmax", "ice"] and "alpha" not in blocks[1] and "ice_scale" not in blocks[0]
    assert "Config of Optuna #14 (the pick), seed 0:" in text and "softmax and ice loss" in text


def test_serve_commands_use_this_environment_and_an_absolute_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    serve, curl = serve_commands("sqlite:///runs/mlflow.db", "models:/s1-embedding/2", port=5001)
    store = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert serve == f"MLFLOW_TRACKING_URI={store} {sys.executable} -m study.serve -m models:/s1-embedding/2 -p 5001"
    payload = json.loads(curl.split(" -d '")[1].rstrip("'"))
    assert np.array(payload["inputs"]).shape == (1, 8, 8)  # one 8 x 8 image: its last axis is no channel count
    assert as_uint8_images(np.array(payload["inputs"], dtype=object)).shape == (1, 8, 8)


# -- end to end: study.final --study, then the stock `mlflow models serve` (study.serve: tests/test_serve_limits.py) ---


def fake_study(uri: str, experiment: str, name: str, artifacts: Path) -> str:
    """A finished study's parent run as study.final --study reads it: tags and best_config.yaml (artifacts under
    ``artifacts``: MLflow's default is ./mlruns in the working directory, the checkout)."""
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment(experiment, artifact_location=artifacts.as_uri())
    run_id = client.create_run(experiment_id, run_name=name, tags={"study_name": name, "kind": "study"}).info.run_id
    recorded = recorded_params(final_epochs=None)  # the study's record; the pick retrains to its own epochs
    client.log_batch(run_id, params=[mlflow.entities.Param(k, v) for k, v in recorded.items()])
    client.log_dict(run_id, {**TINY, "epochs": 1}, "best_config.yaml")
    client.set_terminated(run_id)
    return run_id


def png_images(n: int) -> list[Image.Image]:
    """n Omniglot PNGs as PIL opens them (mode "1", 105 x 105), or drawn glyphs without the data."""
    root = omniglot_root()
    if root is None:
        return [Image.fromarray(g) for g in synthetic_glyphs(n, 1, 105, seed=3)[0]]
    with zipfile.ZipFile(root / "omniglot" / "images_background_small2.zip") as zf:
        names = sorted(x for x in zf.namelist() if "/Tagalog/" in x and x.endswith(".png"))[:n]
        return [Image.open(io.BytesIO(zf.read(x))) for x in names]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_for_ping(server: subprocess.Popen, port: int, log: Path, deadline_s: float = 300) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        try:  # between tries, wait on the server's own exit: a server that dies fails the test at once
            server.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"mlflow models serve exited {server.returncode}:\n{log.read_text()[-3000:]}")
    pytest.fail(f"no answer on /ping within {deadline_s} s:\n{log.read_text()[-3000:]}")


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL if it is still there after 30 s."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def in_process_embeddings(uri: str, model_uri: str, images: np.ndarray, tmp_path: Path) -> np.ndarray:
    """mlflow.pyfunc.load_model(model_uri).predict(images) in a fresh Python (loading adds the model's code to sys.path)."""
    np.save(tmp_path / "x.npy", images)
    code = (
        "import sys, warnings, numpy as np, mlflow; warnings.simplefilter('default'); mlflow.set_tracking_uri(sys.argv[1]); "
        "np.save(sys.argv[3], mlflow.pyfunc.load_model(sys.argv[2]).predict(np.load(sys.argv[4])))"
    )
    args = [sys.executable, "-c", code, uri, model_uri, str(tmp_path / "e.npy"), str(tmp_path / "x.npy")]
    out = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "type hints" not in out.stderr, out.stderr
    return np.load(tmp_path / "e.npy")


def check_logged_model(uri: str, registered: str) -> str:
    """The registered version: described, its model signed, with an input example, pinned requirements and linked metrics."""
    client = mlflow.MlflowClient(uri)
    version = client.get_model_version(registered.split("/")[1], registered.split("/")[2])
    assert "study s1" in version.description and "recall_at_1" in version.description and "```yaml" in version.description
    info = mlflow.models.get_model_info(registered)
    logged = client.get_logged_model(info.model_id)
    assert logged.name == "embedding-seed0"  # issue 32, finding 8: each seed's model by its seed, not three called "model"
    assert {m.key for m in logged.metrics} >= {"test_recall_at_1", "test_nmi", "test_positive_similarity_mean"}
    assert info.signature.inputs.input_names() == ["images"] and info.saved_input_example_info is not None
    folder = Path(mlflow.artifacts.download_artifacts(registered, tracking_uri=uri))
    assert f"torch=={metadata.version('torch').split('+')[0]}" in (folder / "requirements.txt").read_text().split()
    assert np.array(json.loads((folder / "serving_input_example.json").read_text())["inputs"]).shape == (2, 28, 28)
    return info.model_id


@pytest.mark.faults
@pytest.mark.slow
def test_mlflow_models_serve_embeds_pngs_as_the_model_does_in_process(tmp_path, runs, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fake_study(uri, "e", "s1", tmp_path / "artifacts")
    assert final.main(["--study", "s1", "--seeds", "1", "--tracking-uri", uri, "--experiment", "e"]) == 0
    out = capsys.readouterr().out
    serve_line = next(line.strip() for line in out.splitlines() if " -m study.serve -m " in line)
    registered = serve_line.split(" -m ")[2].split()[0]
    assert registered == "models:/s1-embedding/1" and "curl -s http://127.0.0.1:5001/invocations" in out
    check_logged_model(uri, registered)

    pngs = png_images(2)
    pixels = np.stack([np.asarray(png) for png in pngs])  # bool (2, 105, 105) for Omniglot's mode "1" PNGs
    expected = in_process_embeddings(uri, registered, pixels, tmp_path)

    port, log = free_port(), tmp_path / "serve.log"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    command = [str(bin_dir / "mlflow"), "models", "serve", "-m", registered, "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    with open(log, "w") as sink:
        server = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    try:
        wait_for_ping(server, port, log)
        status, body = post(f"http://127.0.0.1:{port}/invocations", {"inputs": pixels.tolist()})  # JSON true/false
        assert status == 200, body
        np.testing.assert_allclose(np.array(body["predictions"], dtype=np.float32), expected, atol=1e-5)
        status, body = post(f"http://127.0.0.1:{port}/invocations", {"inputs": (pixels * 255).astype(int).tolist()})  # 0..255
        assert status == 200 and np.allclose(body["predictions"], expected, atol=1e-5)
        status, body = post(f"http://127.0.0.1:{port}/invocations", {"inputs": [[[0, 1000], [3, 4]]]})
        reason = body["message"].splitlines()[-1]
        assert status == 400 and body["error_code"] == "INVALID_PARAMETER_VALUE"
        assert reason.startswith("Error: got an array of int64") and "values from 0 to 1000" in reason and "expected" in reason
    finally:
        stop_server(server)
    assert "type hints" not in log.read_text()
