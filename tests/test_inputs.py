"""Inputs and paths from a tired user or an attacker: each is refused in one line (exit 2) before anything starts, or read as meant.

The classes: paths and names that would leave their folder, model inputs of every shape, addresses and stores that
would hang or retry for minutes, YAML that expands without bound, bounds and images that raise tracebacks, and data
whose retrieval metrics would be NaN. docs/reference/faults.md, "Bad input", lists them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
import yaml
from PIL import Image

from study import checks, inputs
from study.final import cli as final
from study.final.images import as_uint8_images
from study.launch import cli as launch
from study.launch.settings import check_storage, prepare_space
from study.records import tracking
from study.report import cli as report
from study.search.spaces import SpaceError, load_space
from tests.test_final import TINY
from tests.test_reliability import SMOKE, assert_nothing_left, refused_port, smoke_with, write
from tests.test_report import write_study_records
from tests.test_serving import embedding_model
from trainables.core.data import DatasetError, read_image


def run_launch(argv: list[str], capsys) -> tuple[int, str]:
    """study.launch's exit status and its last line on stderr."""
    try:
        code = launch.main(argv)
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def run_final(argv: list[str], capsys) -> tuple[int, str]:
    code = final.main(argv)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) <= 1, err
    return code, err


def assert_refused(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("error:") and "\n" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


# -- paths: study.report --out ------------------------------------------------------------------------------------------


def logged_report_files(uri: str) -> set[str]:
    client = mlflow.MlflowClient(uri)
    parent = tracking.find_study_run(client, client.get_experiment_by_name("dml-studies").experiment_id, "hand")
    return {a.path for a in client.list_artifacts(parent.info.run_id, "report")}


def test_report_out_never_deletes_or_uploads_what_it_did_not_write(tmp_path, runs, capsys):
    uri = write_study_records(tmp_path, f"journal:{tmp_path / 'optuna.log'}")
    home = tmp_path / "home"  # a folder of the user's: --out ~ must not push it, nor lose its tmp/
    (home / "tmp").mkdir(parents=True)
    (home / "tmp" / "keep.txt").write_text("mine")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text("secret")
    code = report.main(["--study", "hand", "--tracking-uri", uri, "--out", str(home)])
    assert_refused(code, capsys.readouterr().err.strip().splitlines()[-1], f"--out {home}", "did not write")
    assert (home / "tmp" / "keep.txt").read_text() == "mine" and (home / ".ssh" / "id_rsa").is_file()
    assert logged_report_files(uri) == set()

    out = tmp_path / "fresh"
    assert report.main(["--study", "hand", "--tracking-uri", uri, "--out", str(out)]) == 0
    written = {p.name for p in out.iterdir()} - {report.MARKER}
    assert "report.md" in written and not (out / "tmp").exists()
    assert logged_report_files(uri) == {f"report/{name}" for name in written}  # only what the report wrote
    (out / "notes.txt").write_text("added by hand")
    assert report.main(["--study", "hand", "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0  # its own folder again
    assert (out / "notes.txt").read_text() == "added by hand"
    assert "report/notes.txt" not in logged_report_files(uri)
    assert not [p for p in out.iterdir() if p.name.startswith(".report-")]  # no staging folder left


def test_report_default_folder_of_a_study_name_that_leaves_reports(tmp_path, runs):
    with pytest.raises(inputs.UsageError, match="--study '../../x': not usable as a folder name"):
        report.out_folder(None, "../../x")
    assert report.out_folder(None, "hand") == (runs / "reports" / "hand").resolve()


# -- paths: experiment names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("experiment", ["../../x", "..", "/abs/x", "a/../../b", "x\n"])
def test_experiment_name_that_leaves_the_artifacts_folder_is_refused(tmp_path, runs, capsys, experiment):
    code, err = run_launch(["--space", str(SMOKE), "--experiment", experiment], capsys)
    assert_refused(code, err, "--experiment")
    assert_nothing_left(runs)
    config = write(tmp_path / "c.yaml", yaml.safe_dump({**TINY, "epochs": 1}))
    code, err = run_final(["--config", str(config), "--experiment", experiment, "--seeds", "1"], capsys)
    assert_refused(code, err, "--experiment")
    assert not (tmp_path / "x").exists() and not Path("/abs/x").exists()
    assert_nothing_left(runs)


def test_experiment_name_with_a_subfolder_stays_under_artifacts(runs):
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    assert tracking.experiment_artifacts(uri, "team/dml") == (runs / "artifacts" / "team" / "dml").resolve().as_uri()
    assert tracking.experiment_artifacts("http://127.0.0.1:5000", "team/dml") is None  # the server chooses


# -- paths: pretrained weights files ------------------------------------------------------------------------------------


def test_relative_pretrained_is_resolved_on_the_driver_and_a_missing_one_refused(tmp_path, runs, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "w.pt", "weights")  # whether they fit the backbone is the trials' check (and study.final's)
    space = smoke_with(tmp_path, "weights", fixed__pretrained="w.pt")
    args = launch.parse_args(["--space", str(space)])
    assert prepare_space(args).fixed["pretrained"] == str(tmp_path / "w.pt")
    grid = write(tmp_path / "grid.yaml", yaml.safe_dump({"fixed": {"dataset": "synthetic"}, "grid": {"pretrained": ["none", "w.pt"]}}))
    assert prepare_space(launch.parse_args(["--space", str(grid)])).grid["pretrained"] == ["none", str(tmp_path / "w.pt")]

    missing = smoke_with(tmp_path, "missing", fixed__pretrained="gone.pt")
    code, err = run_launch(["--space", str(missing)], capsys)
    assert_refused(code, err, "fixed.pretrained", "gone.pt", str(tmp_path))
    assert_nothing_left(runs)


# -- model inputs of every shape ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "images, channels, shape",
    [
        (np.zeros((20, 30), np.uint8), None, (1, 20, 30)),  # 2-D: one gray image
        (np.zeros((5, 20, 30), np.uint8), None, (5, 20, 30)),  # 3-D: a batch
        (np.zeros((3, 20, 30), np.uint8), 1, (3, 20, 30)),  # a gray model: three gray images
        (np.zeros((32, 32, 3), np.uint8), 3, (1, 32, 32, 3)),  # one RGB image, never 32 images
        (np.zeros((32, 32, 3), np.uint8), 1, (1, 32, 32, 3)),
        (np.zeros((32, 32, 4), np.uint8), 3, (1, 32, 32, 4)),
        (np.zeros((32, 32, 1), np.uint8), 3, (1, 32, 32, 1)),
        (np.zeros((2, 9, 9, 1), np.uint8), 3, (2, 9, 9, 1)),  # 4-D NHWC, C = 1, 3, 4
        (np.zeros((2, 9, 9, 3), np.uint8), 1, (2, 9, 9, 3)),
        (np.zeros((2, 9, 9, 4), np.uint8), 3, (2, 9, 9, 4)),
        (np.ones((2, 5, 6), bool), None, (2, 5, 6)),
        (np.full((2, 5, 6), 0.5), None, (2, 5, 6)),
        (np.array([[[0, 255], [7, 9]]], dtype=object), None, (1, 2, 2)),  # int64 from JSON, as MLflow hands it over
        (np.zeros((0, 32, 32), np.uint8), None, (0, 32, 32)),  # an empty batch
    ],
)
def test_accepted_shapes(images, channels, shape):
    assert np.asarray(as_uint8_images(images, channels)).shape == shape


@pytest.mark.parametrize(
    "images, channels, needle",
    [
        (np.zeros((3, 40, 40), np.uint8), 3, "ambiguous for this RGB model"),  # (C, H, W) or 3 gray images?
        (np.zeros((4, 40, 40), np.uint8), 3, "(40, 40, 4)"),
        (np.zeros((2, 3, 40, 40), np.uint8), 3, "channels first?"),  # NCHW
        (np.zeros((2, 9, 9, 2), np.uint8), None, "shape (2, 9, 9, 2)"),  # C = 2
        (np.zeros((1, 2, 9, 9, 3), np.uint8), None, "shape (1, 2, 9, 9, 3)"),  # 5-D
        (np.zeros(7, np.uint8), None, "shape (7,)"),  # 1-D
        (np.zeros((2, 0, 9), np.uint8), None, "shape (2, 0, 9)"),  # no pixels
        (np.broadcast_to(np.uint8(0), (1, 20_000, 20_000)), None, "pixels per image"),  # 400 Mpx: a memory bomb
        (np.array([[[0, 256]]]), None, "values from 0 to 256"),
        (np.array([[[0.0, np.nan]]]), None, "NaN"),
    ],
)
def test_refused_shapes_and_values(images, channels, needle):
    with pytest.raises(ValueError) as caught:
        as_uint8_images(images, channels)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_the_model_reads_each_shape_by_its_channels(tmp_path):
    rgb_model, gray_model = embedding_model(tmp_path, "photos"), embedding_model(tmp_path, "characters")
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    for model in (rgb_model, gray_model):
        assert model.predict(None, image).shape == (1, 16)  # one RGB image: one embedding
        assert model.predict(None, np.array([], dtype=object)).shape == (0, 16)  # {"inputs": []}
        assert model.predict(None, []).shape == (0, 16)
    assert gray_model.predict(None, image.transpose(2, 0, 1)).shape == (3, 16)  # a gray model: three gray images
    with pytest.raises(ValueError, match="ambiguous"):
        rgb_model.predict(None, image.transpose(2, 0, 1))
    np.testing.assert_allclose(  # the two forms the error offers mean what they say
        rgb_model.predict(None, image.transpose(2, 0, 1).transpose(1, 2, 0)), rgb_model.predict(None, image), atol=1e-6
    )
    assert rgb_model.predict(None, image.transpose(2, 0, 1)[..., None]).shape == (3, 16)


# -- hangs: Ray addresses, cluster resources, YAML that expands -----------------------------------------------------------


def test_address_with_no_ray_listening_is_refused_before_ray_starts(tmp_path, runs, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    port = refused_port()
    cases = [
        (f"127.0.0.1:{port}", ["Connection refused", f"127.0.0.1:{port}"]),
        ("auto", ["no Ray cluster was started on this machine", "ray start --head"]),
        ("ray://127.0.0.1:10001", ["Ray Client", "--address auto"]),
        ("http://127.0.0.1:6379", ["without a scheme"]),
        ("nohost", ["is not HOST:PORT"]),
        ("127.0.0.1:99999", ["is not HOST:PORT"]),
        ("no-such-host.invalid:6379", ["no-such-host.invalid:6379"]),
    ]
    for address, needles in cases:
        code, err = run_launch(["--space", str(SMOKE), "--address", address], capsys)
        assert_refused(code, err, f"--address {address}", *needles)
        assert_nothing_left(runs)
    (tmp_path / "raytmp" / "ray").mkdir(parents=True)
    (tmp_path / "raytmp" / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")  # a cluster that has stopped
    code, err = run_launch(["--space", str(SMOKE), "--address", "auto"], capsys)
    assert_refused(code, err, "--address auto (the cluster last started here", f"127.0.0.1:{port}")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    code, err = run_launch(["--space", str(SMOKE), "--address", "auto"], capsys)
    assert_refused(code, err, "(from $RAY_ADDRESS)")
    assert_nothing_left(runs)


def refusing_ray_init(cause: BaseException):
    """``ray.init`` as Ray 2.60 fails on a cluster that listens but refuses the driver (seen against `ray start --head`
    with an explicit HOST:PORT): a ConnectionError raised from a RuntimeError, raised from ``cause`` if it is an
    exception, else whose message holds ``cause`` as text (Ray puts the AuthenticationError's traceback there)."""

    def init(*args, **kwargs):
        try:
            if isinstance(cause, str):
                raise RuntimeError(f"Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n{cause}")
            try:
                raise cause
            except BaseException as inner:
                raise RuntimeError("Failed to connect to GCS") from inner
        except RuntimeError as outer:
            raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs.get('address')}") from outer

    return init


def test_a_cluster_that_refuses_the_driver_is_one_line_naming_the_address_and_leaves_nothing(tmp_path, runs, capsys, monkeypatch):
    import ray
    import ray.exceptions

    config = write(tmp_path / "tiny.yaml", yaml.safe_dump(TINY))
    with socket.socket() as server:  # passes check_address: something listens
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        message = "RPC error: InvalidAuthToken: Authentication token is missing or incorrect"
        for cause in (f"ray.exceptions.AuthenticationError: {message}", ray.exceptions.AuthenticationError(message)):
            monkeypatch.setattr(ray, "init", refusing_ray_init(cause))
            code, err = run_launch(["--space", str(SMOKE), "--address", address], capsys)
            assert_refused(code, err, f"--address {address}", "token authentication", "--address auto", "RAY_AUTH_MODE=token")
            assert_nothing_left(runs)
        code, err = run_final(["--config", str(config), "--seeds", "2", "--address", address], capsys)
        assert_refused(code, err, f"--address {address}", "token authentication", "--address auto")
        assert_nothing_left(runs)
        monkeypatch.setattr(ray, "init", refusing_ray_init(OSError("version mismatch")))
        code, err = run_launch(["--space", str(SMOKE), "--address", address], capsys)
        assert_refused(code, err, f"--address {address}: Ray could not connect (Failed to connect to Ray cluster at {address})")
        assert_nothing_left(runs)


def test_address_where_something_listens_passes_the_check():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        checks.check_address(f"127.0.0.1:{server.getsockname()[1]}")
    checks.check_address(None)


@pytest.mark.slow
def test_trial_resources_no_node_offers_are_refused():
    import ray

    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False)  # never a Ray already running here
    try:
        checks.check_cluster_resources(1, 0)
        checks.check_cluster_resources(0.5, 0)
        with pytest.raises(inputs.UsageError, match=r"--cpus-per-trial 2 --gpus-per-trial 0: no node .* the largest have 1 CPUs"):
            checks.check_cluster_resources(2, 0)
        with pytest.raises(inputs.UsageError, match="0 GPUs"):
            checks.check_cluster_resources(1, 0.5)
    finally:
        ray.shutdown()


def billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        previous, current = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{current}: &{current} [" + ", ".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_that_expands_without_bound_is_refused(tmp_path, runs, capsys):
    body = SMOKE.read_text()[SMOKE.read_text().index("fixed:") :]  # the smoke space without its description
    in_description = write(tmp_path / "desc.yaml", nested("description", billion_laughs()) + body)  # str(description): 9^9 values
    in_choices = write(tmp_path / "choices.yaml", nested("description", billion_laughs()) + body.replace("[softmax, ice]", "*i"))
    for path in (in_description, in_choices):
        code, err = run_launch(["--space", str(path)], capsys)
        assert_refused(code, err, str(path), "aliases expand to more than 100000 values")
        assert_nothing_left(runs)
    config = write(tmp_path / "bomb_config.yaml", yaml.safe_dump(TINY) + nested("seed", billion_laughs()))  # repr(seed) in its error
    code, err = run_final(["--config", str(config)], capsys)
    assert_refused(code, err, "bomb_config.yaml", "aliases expand to more than")
    for text, needle in (("a: &a [*a]\n", "refers to a value that contains it"), ("x: " + "[" * 5000 + "]" * 5000, "nested too deeply")):
        with pytest.raises(inputs.UsageError, match=needle):
            inputs.read_yaml(write(tmp_path / "odd.yaml", text), "a search space")
    big = write(tmp_path / "big.yaml", "description: " + "x" * (inputs.MAX_YAML_BYTES + 1))
    with pytest.raises(inputs.UsageError, match="bytes; expected a search space, at most"):
        inputs.read_yaml(big, "a search space")
    with_merge = write(tmp_path / "merge.yaml", "base: &b {x: 1}\nuse: {<<: *b, y: 2}\n")  # aliases within bounds still work
    assert inputs.read_yaml(with_merge, "x")["use"] == {"x": 1, "y": 2}


def test_a_key_given_twice_is_refused_and_every_shipped_file_reads(tmp_path, runs, capsys):
    twice = write(tmp_path / "twice.yaml", SMOKE.read_text() + "  lr: {type: float, low: 0.1, high: 0.2}\n")  # lr again
    code, err = run_launch(["--space", str(twice)], capsys)
    assert_refused(code, err, f"{twice}:18:3:", "key 'lr' appears twice")
    root = Path(__file__).resolve().parents[1]
    for path in [*sorted((root / "search_spaces").glob("*.yaml")), *sorted((root / "configs").glob("*.yaml"))]:
        assert isinstance(inputs.read_yaml(path, "a shipped file"), dict), path


def nested(key: str, mapping: str) -> str:
    """``key:`` holding the YAML mapping ``mapping``, indented."""
    return f"{key}:\n" + "".join(f"  {line}\n" for line in mapping.splitlines())


# -- tracebacks made one-line errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bound", [".nan", ".inf", "-.inf"])
def test_nan_and_infinite_bounds_are_refused(tmp_path, runs, capsys, bound):
    text = SMOKE.read_text().replace("lr: {type: float, low: 0.0005,", f"lr: {{type: float, low: {bound},")
    code, err = run_launch(["--space", str(write(tmp_path / "nan.yaml", text))], capsys)
    assert_refused(code, err, "params.lr.low", "not a finite number")
    text = SMOKE.read_text().replace(
        "classes_per_batch: {type: int, low: 4, high: 8, step: 4}", f"classes_per_batch: {{type: int, low: 4, high: 8, step: {bound}}}"
    )
    with pytest.raises(SpaceError, match="params.classes_per_batch.step"):
        load_space(write(tmp_path / "step.yaml", text))


def readonly_folder(tmp_path: Path) -> Path:
    """A folder no new file can be made in, also for root (who ignores permission bits): a chmod-ed one, else /sys."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            (candidate / ".probe").touch()
            (candidate / ".probe").unlink()
        except OSError:
            return candidate
    pytest.skip("no read-only folder available here")


def test_tracking_stores_mlflow_cannot_keep_a_study_in(tmp_path, runs, capsys, monkeypatch):
    cases = [
        (f"file://{tmp_path / 'mlruns'}", ["file store is not supported", "sqlite:///"]),
        (str(tmp_path / "mlruns"), ["file store is not supported", "sqlite:///"]),
        ("sqlite://", ["in-memory"]),
        (f"sqlite:///{readonly_folder(tmp_path) / 'mlflow.db'}", ["is not writable"]),
        (f"sqlite:///{write(tmp_path / 'afile', 'x') / 'mlflow.db'}", ["is not writable"]),
    ]
    for uri, needles in cases:
        code, err = run_launch(["--space", str(SMOKE), "--tracking-uri", uri], capsys)
        assert_refused(code, err, f"--tracking-uri {uri}", *needles)
        config = write(tmp_path / "c.yaml", yaml.safe_dump({**TINY, "epochs": 1}))
        code, err = run_final(["--config", str(config), "--tracking-uri", uri, "--seeds", "1"], capsys)
        assert_refused(code, err, f"--tracking-uri {uri}", *needles)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path / 'mlruns'}")
    code, err = run_launch(["--space", str(SMOKE)], capsys)
    assert_refused(code, err, "($MLFLOW_TRACKING_URI)")
    assert not (tmp_path / "mlruns").exists()
    assert_nothing_left(runs)


@contextlib.contextmanager
def not_http_server(reply: bytes):
    """A loopback server that answers every connection with ``reply`` and closes it (a gRPC port, say); yields its URL."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        with contextlib.suppress(OSError):  # closed at the end of the test
            while True:
                connection, _ = server.accept()
                with connection:
                    connection.recv(65536)  # the request, so that the reply is read and not reset
                    connection.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


@pytest.mark.parametrize("reply", [b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00@\x00\x00", b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_a_tracking_uri_where_something_else_than_http_answers_is_refused(tmp_path, runs, capsys, reply):
    with not_http_server(reply) as uri:
        code, err = run_launch(["--space", str(SMOKE), "--tracking-uri", uri], capsys)
    assert_refused(code, err, f"--tracking-uri {uri}", "unreachable", "not an HTTP reply")
    assert_nothing_left(runs)


def test_optuna_storages_that_cannot_hold_a_study(tmp_path, runs, capsys):
    port = refused_port()
    cases = [
        ("notaurl", "not a storage URL"),
        ("journal:", "expected journal:PATH of a file"),
        (f"journal:{tmp_path}", "expected journal:PATH of a file"),
        (f"journal:{write(tmp_path / 'afile', 'x') / 'journal.log'}", "is not writable"),
        ("nosuchdialect://u@h/db", "no database driver"),
        ("mysql://u@h/db", "no database driver for it (No module named 'MySQLdb')"),  # SQLAlchemy knows the dialect, not its driver
        ("sqlite://", "in-memory"),
        (f"mysql+pymysql://u@127.0.0.1:{port}/db", "--optuna-storage"),  # no driver, or no server: either is one line
    ]
    for storage, needle in cases:
        code, err = run_launch(["--space", str(SMOKE), "--optuna-storage", storage], capsys)
        assert_refused(code, err, f"--optuna-storage {storage}", needle)
        assert_nothing_left(runs)
    assert checks.check_optuna_storage(f"sqlite:///{tmp_path / 'optuna.db'}") == f"sqlite:///{tmp_path / 'optuna.db'}"
    assert checks.check_optuna_storage(f"journal:{tmp_path / 'j' / 'journal.log'}") == f"journal:{tmp_path / 'j' / 'journal.log'}"


def test_images_above_the_decompression_bomb_limit_are_dataset_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    warned, refused = tmp_path / "warned.png", tmp_path / "refused.png"
    Image.new("L", (40, 40)).save(warned)  # 1600 px: Pillow only warns (1x to 2x the limit) and decodes
    Image.new("L", (100, 100)).save(refused)  # 10000 px: Pillow raises DecompressionBombError
    for path in (warned, refused):
        with pytest.raises(DatasetError, match=f"{path}: unreadable image \\(DecompressionBomb"):
            read_image(str(path), "characters")


# -- degenerate data ----------------------------------------------------------------------------------------------------


def one_image_per_class(root: Path, train_classes: int = 10, test_classes: int = 3) -> Path:
    for part, classes in (("train", range(train_classes)), ("test", range(train_classes, train_classes + test_classes))):
        for c in classes:
            (root / part / f"class{c}").mkdir(parents=True)
            Image.new("RGB", (12, 12), (c, c, c)).save(root / part / f"class{c}" / "0.png")
    return root


def test_one_image_per_class_is_refused_before_training(tmp_path, runs, capsys):
    data = one_image_per_class(tmp_path / "data")
    space = smoke_with(tmp_path, "folder", fixed__dataset="folder", fixed__samples_per_class=1, params__loss=["softmax"])
    code, err = run_launch(["--space", str(space), "--data-root", str(data)], capsys)
    assert_refused(code, err, "dataset 'folder'", str(data), "validation classes", "at least 2 images per evaluated class")
    assert_nothing_left(runs)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    config = write(tmp_path / "c.yaml", yaml.safe_dump({**TINY, "dataset": "folder", "classes_per_batch": 4, "samples_per_class": 1}))
    code, err = run_final(["--config", str(config), "--data-root", str(data), "--tracking-uri", uri, "--seeds", "1"], capsys)
    assert_refused(code, err, "dataset 'folder'", "test classes", "3 of 3 classes have a single image", "at least 2 images")
    assert_nothing_left(runs)
    assert mlflow.MlflowClient(uri).search_registered_models() == [] if (runs / "mlflow.db").exists() else True


def test_in_shop_queries_without_gallery_images_are_refused(tmp_path):
    from trainables.core.data import ImageSet, check_retrieval_set

    queries = ImageSet(np.array([1, 2]), "photos", paths=["q1", "q2"])
    with pytest.raises(DatasetError, match="no query class has an image in the gallery"):
        check_retrieval_set(queries, ImageSet(np.array([3, 3]), "photos", paths=["g1", "g2"]), "dataset 'inshop'")
    check_retrieval_set(queries, ImageSet(np.array([1, 3]), "photos", paths=["g1", "g2"]), "dataset 'inshop'")


def test_writable_check_names_the_flag(tmp_path):
    with pytest.raises(inputs.UsageError, match="--storage-path: .* is not writable"):
        check_storage(str(write(tmp_path / "f", "x") / "ray"))
    assert check_storage(str(tmp_path / "new" / "ray")) == str(tmp_path / "new" / "ray")
    assert not [p for p in (tmp_path / "new" / "ray").iterdir()]  # the probe is gone
    assert os.access(tmp_path / "new" / "ray", os.W_OK)


def test_validation_by_alphabet_on_data_without_alphabets_is_refused_before_training(tmp_path, runs, capsys):
    space = smoke_with(tmp_path, "alphabets", fixed__val_split="alphabets")  # the smoke space's synthetic glyphs
    code, err = run_launch(["--space", str(space)], capsys)
    assert_refused(code, err, "dataset 'synthetic'", "val_split=alphabets", "alphabet/character", "expected val_split: classes")
    assert_nothing_left(runs)


def test_a_read_only_runs_folder_or_store_is_refused_in_seconds_by_every_command(tmp_path, runs, capsys, monkeypatch):
    """Issue 33, finding 7: with a read-only runs folder study.final gave an OSError traceback and study.report retried
    MLflow for about 100 s before a traceback. Every command shares tracking.check_store: one line, exit 2, in seconds."""
    from study import sync
    from tests.test_names import two_studies

    two_studies(runs)  # studies in a writable store, for the commands that read one
    writable = tracking.resolve_tracking_uri(None)
    readonly = readonly_folder(tmp_path)
    config = str(write(tmp_path / "c.yaml", yaml.safe_dump({**TINY, "epochs": 1})))

    def commands(uri: str) -> list:
        return [
            (final.main, ["--config", config, "--seeds", "1", "--tracking-uri", uri]),
            (final.main, ["--study", "base", "--seeds", "1", "--tracking-uri", uri]),
            (report.main, ["--study", "base", "--tracking-uri", uri]),
            (sync.main, ["--study", "base", "--tracking-uri", uri]),
            (launch.main, ["--space", str(SMOKE), "--tracking-uri", uri]),
        ]

    cases = [(readonly, main, argv, "the runs folder") for main, argv in commands(writable)]  # logs, spool, reports: nowhere to go
    store = f"sqlite:///{readonly / 'mlflow.db'}"
    cases += [(runs, main, argv, f"--tracking-uri {store}") for main, argv in commands(store)]
    for folder, main, argv, needle in cases:
        monkeypatch.setenv("DML_RUNS_DIR", str(folder))
        started = time.monotonic()
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
        err = capsys.readouterr().err.strip()
        assert_refused(code, err, needle, "not writable")
        assert time.monotonic() - started < 10, (argv, time.monotonic() - started)
    assert not (runs / "reports").exists()
