"""The served model's HTTP edge (python -m study.serve): oversize and hostile requests answered with a 4xx and a bounded
reply, beside what the stock `mlflow models serve` answers to the same bytes.

The guard's rules are checked in-process on a stand-in ASGI app; the fault tests start both servers on one logged
model and send each hostile request over a socket, then a valid one, whose embeddings must be the stock server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from study.serve import cli
from study.serve.guard import MAX_ERROR_BYTES, MIB, Guard, Limits, bounded, json_shape
from tests.test_serving import free_port, stop_server, wait_for_ping

# -- the scan and the cut, by hand -----------------------------------------------------------------------------------


def test_json_shape_counts_depth_and_images_by_hand():
    assert json_shape(b'{"inputs": [[[0, 255]], [[1, 2]]]}') == (4, 2)  # object, batch, image, row; two images
    assert json_shape(b'{"inputs": [[[[0, 0, 0]]]]}') == (5, 1)  # one RGB image in a batch
    assert json_shape(b'{"inputs": [[0, 1], [2, 3], [4, 5]]}') == (3, 3)  # one (H, W) image: its rows count
    assert json_shape(b'{"a": "[[[[{{{", "b": "\\"[[["}') == (1, 0)  # brackets in strings, escaped quotes
    assert json_shape(b"[" * 100_000 + b"]" * 100_000) == (100_000, 1)  # no recursion
    assert json_shape(b"") == (0, 0) and json_shape(b"not json") == (0, 0)


def test_json_shape_across_scan_chunks(monkeypatch):
    monkeypatch.setattr("study.serve.guard._SCAN_CHUNK", 3)  # the running depth carries from chunk to chunk
    assert json_shape(b'{"inputs": [[[0, 255]], [[1, 2]], [[3]]]}') == (4, 3)


def test_an_error_reply_is_cut_to_its_code_head_and_tail():
    echoed = "Invalid input. Ensure that input is a valid JSON formatted string.\nInput: \n" + "x" * 2_000_000 + "\nError: why"
    cut = bounded(json.dumps({"error_code": "BAD_REQUEST", "message": echoed}).encode())
    reply = json.loads(cut)
    assert len(cut) <= MAX_ERROR_BYTES and reply["error_code"] == "BAD_REQUEST"
    assert (
        reply["message"].startswith("Invalid input.") and reply["message"].endswith("Error: why") and "characters cut" in reply["message"]
    )
    assert bounded(b"Internal Server Error") == b"Internal Server Error"
    assert len(bounded(b"<" * 100_000)) <= MAX_ERROR_BYTES


# -- the guard on a stand-in app -------------------------------------------------------------------------------------


def call(guard_limits: Limits, headers: dict[str, str], chunks: list[bytes], path: str = "/invocations", reply_size: int = 10):
    """The guard around an app that echoes the body's length (or an error of ``reply_size`` bytes for body b"fail"):
    (status, reply body, what the app received or None, how many chunks the guard read)."""
    seen: dict[str, bytes] = {}
    read = 0

    async def app(scope, receive, send):
        message = await receive()
        seen["body"] = message["body"]
        status, body = (
            (500, json.dumps({"error_code": "X", "message": "y" * reply_size}).encode()) if message["body"] == b"fail" else (200, b"ok")
        )
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def receive():
        nonlocal read
        read += 1
        return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(Guard(app, guard_limits)(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), seen.get("body"), read


LIMITS = Limits(max_body=1000, max_depth=6, max_images=4)
JSON = {"content-type": "application/json"}


def test_a_declared_length_over_the_limit_is_413_before_a_byte_is_read():
    status, body, app_got, read = call(LIMITS, {**JSON, "content-length": "1001"}, [b"x" * 1001])
    assert (status, app_got, read) == (413, None, 0)
    assert json.loads(body)["error_code"] == "BODY_TOO_LARGE" and "the limit is " in json.loads(body)["message"]


def test_a_streamed_body_is_counted_and_stopped_at_the_limit():
    status, body, app_got, read = call(LIMITS, JSON, [b" " * 400] * 10)  # no Content-Length: chunked
    assert (status, app_got, read) == (413, None, 3)  # 1,200 bytes read of 4,000: the rest never
    assert b"over 1200 bytes streamed" in body


def test_deep_json_and_many_images_are_400_and_a_valid_body_reaches_the_app_whole():
    status, body, app_got, _ = call(LIMITS, JSON, [b"[" * 7 + b"]" * 7])
    assert status == 400 and json.loads(body)["error_code"] == "TOO_DEEP" and app_got is None
    status, body, app_got, _ = call(LIMITS, JSON, [b'{"inputs": [[[0]], [[0]], [[0]], [[0]], [[0]]]}'])
    assert status == 400 and json.loads(body)["error_code"] == "TOO_MANY_IMAGES" and app_got is None
    valid = b'{"inputs": [[[0, 1], [2, 3]]]}'
    assert call(LIMITS, JSON, [valid[:10], valid[10:]]) == (200, b"ok", valid, 2)
    # only JSON to /invocations is scanned: MLflow parses nothing else as JSON
    assert call(LIMITS, {"content-type": "text/csv"}, [b"[" * 7])[0] == 200
    assert call(LIMITS, JSON, [b"[" * 7], path="/ping")[0] == 200


def test_the_apps_own_error_replies_are_bounded():
    status, body, _, _ = call(LIMITS, JSON, [b"fail"], reply_size=100_000)
    assert status == 500 and len(body) <= MAX_ERROR_BYTES and json.loads(body)["error_code"] == "X"
    assert len(call(LIMITS, JSON, [b"fail"], reply_size=50)[1]) > 50  # a short one goes through as is


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["-m", "x", "--max-body-mb", "0"], "--max-body-mb 0: expected more than 0"),
        (["-m", "x", "--max-body-mb", "nan"], "--max-body-mb nan"),
        (["-m", "x", "--max-depth", "3"], "--max-depth 3: expected 4 to 100"),
        (["-m", "x", "--max-images", "0"], "--max-images 0: expected at least 1"),
        (["-m", "x", "-p", "70000"], "--port 70000: expected 1 to 65535"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv, needle, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {needle}") and err.count("\n") == 1


# -- both servers, the same requests over a socket -------------------------------------------------------------------

LOG_MODEL = """
import sys, mlflow, numpy as np, torch
from pathlib import Path
from study.final import pyfunc
from tests.test_final import TINY
from trainables.core.config import TrainConfig
from trainables.core.engine import build_model
work, uri = Path(sys.argv[1]), sys.argv[2]
mlflow.set_tracking_uri(uri)
experiment = mlflow.create_experiment("e", artifact_location=(work / "artifacts").as_uri())
config = TrainConfig.from_dict({**TINY, "seed": 0})
torch.manual_seed(0)
net = build_model(config, "characters", 32)
bundle = {"config": config.to_dict(), "epoch": 0, "model": net.state_dict(), "kind": "characters", "image_size": 32}
with mlflow.start_run(experiment_id=experiment):
    print(pyfunc.log_embedding_model(bundle, np.zeros((2, 28, 28), np.uint8), work, "embedding").model_uri)
"""

BODY_LIMIT_MB = 1  # ours, in these tests: a body over it is cheap to send to both servers
VALID = json.dumps({"inputs": [[[0, 255] * 4] * 8, [[255, 0] * 4] * 8]}).encode()


def start(command: list[str], env: dict[str, str], port: int, log: Path, cwd: Path) -> subprocess.Popen:
    with open(log, "w") as sink:
        server = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    wait_for_ping(server, port, log)
    return server


@contextlib.contextmanager
def both_servers(work: Path) -> Iterator[dict[str, int]]:
    """{"stock": port, "ours": port}: `mlflow models serve` and `python -m study.serve --max-body-mb 1` on one model
    logged under ``work``, stopped on leaving."""
    uri = f"sqlite:///{work / 'mlflow.db'}"
    root = Path(__file__).resolve().parents[1]
    bin_dir = Path(sys.executable).parent
    path = f"{bin_dir}:{os.environ.get('PATH', '')}"  # mlflow models serve starts uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(root), "PATH": path}
    logged = subprocess.run(
        [sys.executable, "-c", LOG_MODEL, str(work), uri], capture_output=True, text=True, cwd=root, env=env, timeout=300
    )
    assert logged.returncode == 0, logged.stderr[-3000:]
    model = logged.stdout.split()[-1]
    ports = {"stock": free_port(), "ours": free_port()}
    commands = {
        "stock": [str(bin_dir / "mlflow"), "models", "serve", "-m", model, "--env-manager", "local", "-h", "127.0.0.1"],
        "ours": [sys.executable, "-m", "study.serve", "-m", model, "--max-body-mb", str(BODY_LIMIT_MB)],
    }
    running = []
    try:
        for name, command in commands.items():
            running.append(start([*command, "-p", str(ports[name])], env, ports[name], work / f"{name}.log", work))
        yield ports
    finally:
        for server in running:
            stop_server(server)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with both_servers(tmp_path_factory.mktemp("serve")) as ports:
        yield ports


def exchange(port: int, head: bytes, chunks=()) -> tuple[int, bytes]:
    """Send ``head`` then ``chunks`` until the server answers (or closes); (status, reply body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(head)
        for chunk in chunks:
            if select.select([s], [], [], 0)[0]:  # the server answered: the rest is not sent
                break
            try:
                s.sendall(chunk)
            except OSError:  # it closed the connection on a refused body
                break
        data = b""
        while True:
            try:
                part = s.recv(1 << 20)
            except ConnectionResetError:
                break
            if not part:
                break
            data += part
            top, _, body = data.partition(b"\r\n\r\n")
            lengths = [line for line in top.split(b"\r\n") if line.lower().startswith(b"content-length:")]
            if lengths and len(body) >= int(lengths[0].split(b":")[1]):
                break
    top, _, body = data.partition(b"\r\n\r\n")
    return int(top.split()[1]), body


def post(port: int, body: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
    head = f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return exchange(port, head.encode(), [body[i : i + MIB] for i in range(0, len(body), MIB)])


def streamed(port: int, size: int) -> tuple[int, bytes]:
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b" " * (1 << 16)
    return exchange(port, head, [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (size // len(chunk)) + [b"0\r\n\r\n"])


def embeddings(port: int) -> np.ndarray:
    status, body = post(port, VALID)
    assert status == 200, body[:500]
    return np.array(json.loads(body)["predictions"], np.float32)


MANY = json.dumps({"inputs": [[[0] * 8] * 8] * 3000}).encode()
HOSTILE = {
    # case: (send it, stock's (status, reply size at least), ours' (status, error code))
    "a 2 MiB body streamed without a length": (lambda port: streamed(port, 2 * MIB), (400, 2 * MIB), (413, "BODY_TOO_LARGE")),
    "JSON 100,000 deep": (lambda port: post(port, b"[" * 100_000 + b"]" * 100_000), (500, 0), (400, "TOO_DEEP")),
    "JSON 100,000 deep under inputs": (
        lambda port: post(port, b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        (500, 0),
        (400, "TOO_DEEP"),
    ),
    "3,000 images": (lambda port: post(port, MANY), (200, 3000 * 16 * 10), (400, "TOO_MANY_IMAGES")),
    "malformed JSON of 900 kB": (lambda port: post(port, b'{"inputs": [[[0, 255' + b"x" * 900_000), (400, 900_000), (400, "BAD_REQUEST")),
}


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_request_is_4xx_and_bounded_where_stock_is_not(servers, case):
    send, (stock_status, stock_size), (our_status, our_code) = HOSTILE[case]
    before = embeddings(servers["stock"])
    status, body = send(servers["stock"])  # the stock server: a 5xx, or a reply that grows with the request
    assert status == stock_status and len(body) >= stock_size, (status, len(body), body[:300])
    status, body = send(servers["ours"])
    assert status == our_status and len(body) <= MAX_ERROR_BYTES, (status, len(body), body[:300])
    assert json.loads(body)["error_code"] == our_code and "\n" not in body.decode()
    np.testing.assert_array_equal(embeddings(servers["ours"]), before)  # ours still serves, the stock server's embeddings
    np.testing.assert_array_equal(embeddings(servers["stock"]), before)  # and the stock server too


@pytest.mark.faults
@pytest.mark.slow
def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(servers):
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n"
    status, body = exchange(servers["ours"], head)  # not a byte of the 100 MB sent: the stock server would wait for it
    assert status == 413 and b"Content-Length '104857600'" in body and f"the limit is {BODY_LIMIT_MB} MiB".encode() in body


@pytest.mark.faults
@pytest.mark.slow
def test_what_stock_answers_well_ours_answers_the_same(servers):
    """A wrong content type: 415 and a short line from both. The same endpoints: /ping, /health, /version."""
    for port in servers.values():
        status, body = post(port, VALID, "text/xml")
        assert status == 415 and len(body) < 300 and b"content types" in body
        for path in ("/ping", "/health", "/version"):
            assert exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())[0] == 200
    version = [exchange(port, b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")[1] for port in servers.values()]
    assert version[0] == version[1]
