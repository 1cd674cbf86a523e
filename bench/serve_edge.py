"""What `python -m study.serve` answers to hostile requests beside the stock `mlflow models serve`, and what its guard
costs a valid request.

Workload: one logged embedding model (the tests' tiny one: 16-d, 8 x 8 images) served by both servers on this machine
(ours with ``--max-body-mb 1``, the rest of its limits their defaults); the hostile requests of
tests/test_serve_limits.py sent to each over a socket (``--big`` adds a 100 MB body with its Content-Length, one of
100 MB streamed without it, and 250,000 images in 49 MB: the stock server reads each whole, and works on the images
until its 60 s timeout); then ``--requests`` valid requests of two images to each, alternated. Question: are the
embeddings the same, and what does the guard add? Bound: the median latency of ours at most 1.2x the stock server's.

  python -m bench.serve_edge --requests 50 --big
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import harness
from tests.test_serve_limits import HOSTILE, VALID, both_servers, post, streamed

BOUND = 1.2  # ours' median latency over the stock server's
OUT = harness.ROOT / "docs" / "bench" / "serve_edge"
BIG = {
    "a 100 MB body with its Content-Length": lambda port: post(port, b" " * (100 << 20)),
    "a 100 MB body streamed": lambda port: streamed(port, 100 << 20),
    "250,000 images (49 MB)": lambda port: post(port, json.dumps({"inputs": [[[0] * 8] * 8] * 250_000}).encode()),
}


def timed(send, port: int) -> tuple[int, int, float]:
    """(status, reply bytes, seconds) of one request."""
    started = time.perf_counter()
    status, body = send(port)
    return status, len(body), time.perf_counter() - started


def size(count: int) -> str:
    """A reply's size as a reader compares them: bytes, else MB."""
    return f"{count} B" if count < 100_000 else f"{count / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser("serve_edge", __doc__)
    parser.add_argument("--requests", type=int, default=50, help="valid requests to each server (default 50)")
    parser.add_argument("--big", action="store_true", help="also the 100 MB bodies and 250,000 images (a minute or more)")
    args = parser.parse_args(argv)
    with both_servers(Path(tempfile.mkdtemp(prefix="serve-edge-"))) as ports:
        cases = {name: case[0] for name, case in HOSTILE.items()} | (BIG if args.big else {})
        hostile = {name: {server: timed(send, port) for server, port in ports.items()} for name, send in cases.items()}
        replies = {server: json.loads(post(port, VALID)[1])["predictions"] for server, port in ports.items()}
        latency: dict[str, list[float]] = {server: [] for server in ports}
        for _ in range(args.requests):
            for server, port in ports.items():
                latency[server].append(timed(lambda p: post(p, VALID), port)[2])
    same = np.array_equal(np.array(replies["stock"]), np.array(replies["ours"]))
    median = {server: statistics.median(times) for server, times in latency.items()}
    ratio = median["ours"] / median["stock"]
    rows = [[name, *(f"{status} ({size(n)}, {t:.1f} s)" for status, n, t in found.values())] for name, found in hostile.items()]
    rows.append(
        [f"valid, 2 images: median of {args.requests}", f"{median['stock'] * 1e3:.1f} ms", f"{median['ours'] * 1e3:.1f} ms ({ratio:.2f}x)"]
    )
    lines = harness.table(["request", "`mlflow models serve`: status (reply, time)", "`study.serve`: status (reply, time)"], rows)
    print(harness.machine_line(), "\n" + "\n".join(lines) + f"\nthe same embeddings from both: {same}")
    row = {"command": harness.command("serve_edge", argv or sys.argv[1:]), "machine": harness.machine(), "commit": harness.commit()}
    harness.append_row(OUT.with_suffix(".jsonl"), {**row, "hostile": hostile, "median_s": median, "ratio": ratio, "same": same})
    harness.write(OUT.with_suffix(".md"), "\n".join(lines) + "\n")
    return harness.bound(same and ratio <= BOUND, f"the same embeddings, and ours at most {BOUND:g}x the stock latency ({ratio:.2f}x)")


if __name__ == "__main__":
    raise SystemExit(main())
