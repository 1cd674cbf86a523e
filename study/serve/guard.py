"""The served model's HTTP edge: an ASGI middleware that answers oversize and hostile requests with a 4xx and a bounded
reply before MLflow's scoring app reads them.

``Limits`` holds the three bounds; ``Guard(app, limits)`` wraps any ASGI app (MLflow's ``scoring_server.init(model)``):

- a ``Content-Length`` over ``max_body`` is answered 413 before a byte of the body is read; a body streamed without
  one (chunked) is counted as it arrives and answered 413 at the limit, the rest never read;
- a JSON body to ``/invocations`` is scanned without recursion (strings blanked, brackets counted in C) before MLflow
  parses it: nested deeper than ``max_depth`` or holding more than ``max_images`` lists two levels inside its top
  object (the images of ``{"inputs": [image, ...]}``; the rows of a single image sent without its batch axis) is
  answered 400;
- every error reply, the app's own included, is at most ``MAX_ERROR_BYTES``: MLflow's JSON error keeps its code and the
  head and tail of its message (MLflow echoes a malformed body whole in its message).

The replies of the guard are one line of JSON, ``{"error_code": ..., "message": ...}``, as MLflow's own errors. This
module imports numpy and the standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MIB = 1 << 20
MAX_ERROR_BYTES = 8192  # an error reply's body: a message's head and tail of KEPT characters each fit, escapes included
KEPT = 512
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included (unrolled: linear, no backtracking)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SCAN_CHUNK = 1 << 22  # brackets per step of the depth scan: its memory is a few times this, whatever the body


@dataclass(frozen=True)
class Limits:
    """What a request may hold: ``max_body`` bytes, JSON nested ``max_depth`` deep, ``max_images`` images."""

    max_body: int
    max_depth: int
    max_images: int


def json_shape(body: bytes) -> tuple[int, int]:
    """(the deepest nesting of ``body``'s JSON arrays and objects, how many open two levels inside the top one).

    ``{"inputs": [[[0, 255]], [[1, 2]]]}`` is (4, 2): the top object, the batch, an image, a row; two images. No
    recursion and no Python loop over the body's bytes: the strings are blanked, the brackets kept, and their running
    depth summed by numpy in chunks. A body that is not JSON gets some answer; MLflow's parser refuses it after.
    """
    brackets = _STRING.sub(b'""', body).translate(None, _NOT_BRACKETS)
    deepest, images, depth = 0, 0, 0
    for start in range(0, len(brackets), _SCAN_CHUNK):
        chunk = np.frombuffer(brackets, np.uint8, min(_SCAN_CHUNK, len(brackets) - start), start)
        opens = (chunk == ord("[")) | (chunk == ord("{"))
        depths = depth + np.cumsum(np.where(opens, 1, -1), dtype=np.int64)
        deepest = max(deepest, int(depths.max()))
        images += int(np.count_nonzero(opens & (depths == 3)))
        depth = int(depths[-1])
    return deepest, images


def error_body(code: str, message: str) -> bytes:
    """One line of JSON as MLflow writes its errors."""
    return json.dumps({"error_code": code, "message": message}).encode()


def bounded(body: bytes) -> bytes:
    """An error reply's ``body`` cut to at most MAX_ERROR_BYTES: MLflow's JSON error keeps its code and its message's
    head and tail (what failed, and the last line that says why); anything else its head."""
    if len(body) <= MAX_ERROR_BYTES:
        return body
    try:
        parsed = json.loads(body)
        code, message = str(parsed["error_code"]), str(parsed["message"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return body[: MAX_ERROR_BYTES - 20] + b" ... (reply cut)"
    cut = f"{message[:KEPT]} ... ({len(message) - 2 * KEPT} characters cut) ... {message[-KEPT:]}"
    return error_body(code, cut)[:MAX_ERROR_BYTES]


class Refused(Exception):
    """A request the guard answers itself: its status, error code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Guard:
    """``app`` behind the limits (the module docstring); an ASGI app itself."""

    def __init__(self, app: App, limits: Limits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self.read_body(scope, receive)
            if scope["path"] == "/invocations" and content_type(scope) == "application/json":
                self.check_json(body)
        except Refused as refused:
            await reply(send, refused.status, error_body(refused.code, refused.message))
            return
        await self.app(scope, replay(body, receive), bounded_errors(send))

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, refused past ``max_body``: by its Content-Length before reading, else as it streams in."""
        limit = self.limits.max_body
        declared = header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise self.too_large(f"Content-Length {declared[:20]!r}")
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > limit:
                raise self.too_large(f"over {size} bytes streamed")
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    def too_large(self, what: str) -> Refused:
        mib = self.limits.max_body / MIB
        return Refused(413, "BODY_TOO_LARGE", f"request body too large ({what}); the limit is {mib:g} MiB (--max-body-mb)")

    def check_json(self, body: bytes) -> None:
        depth, images = json_shape(body)
        if depth > self.limits.max_depth:
            detail = 'a batch of images {"inputs": [N][H][W][C]} is 5'
            raise Refused(400, "TOO_DEEP", f"JSON nested {depth} deep; the limit is {self.limits.max_depth} (--max-depth): {detail}")
        if images > self.limits.max_images:
            limit = self.limits.max_images
            raise Refused(
                400, "TOO_MANY_IMAGES", f"{images} images (or rows of one image) in one request; the limit is {limit} (--max-images)"
            )


def header(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lower case), or None."""
    return next((value.decode("latin-1").strip() for key, value in scope["headers"] if key.lower() == name), None)


def content_type(scope: Scope) -> str:
    """The request's media type, lower case, without parameters."""
    return (header(scope, b"content-type") or "").split(";")[0].strip().lower()


async def reply(send: Send, status: int, body: bytes) -> None:
    """A whole JSON reply; the connection closes after it (the rest of a refused body is never read)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then waits on the client as the original does."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def bounded_errors(send: Send) -> Send:
    """A ``send`` that passes successful replies through and cuts an error reply's body with :func:`bounded`."""
    start: Message | None = None
    parts: list[bytes] = []

    async def guarded(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start" and message["status"] >= 400:
            start = message
            return
        if start is None or message["type"] != "http.response.body":
            await send(message)
            return
        parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = bounded(b"".join(parts))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return guarded
