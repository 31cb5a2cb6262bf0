"""Counting the requests an S3-compatible server receives, by bucket and kind: moto's server on
a loopback port with a WSGI middleware in front (`start_server`). Shared by
`benchmarks.bench_s3_requests` and `tests/test_s3_requests.py`; not a benchmark itself.

A request's kind is what it costs on S3: GET of a bucket with `list-type`/`prefix` is a LIST,
POST `?delete` a (batch) DELETE, anything else its HTTP method (a multipart upload is a POST,
PUTs of its parts and a completing POST).
"""

from __future__ import annotations

import collections
import os
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["KINDS", "RequestCounter", "start_server", "uri"]

KINDS = ("PUT", "GET", "HEAD", "LIST", "DELETE", "POST")


class RequestCounter:
    """WSGI middleware counting requests by (bucket, kind); `lists` keeps the LISTs' prefixes
    by bucket, to say which listing a test did not expect."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.lists: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        method = environ["REQUEST_METHOD"]
        query = environ.get("QUERY_STRING", "")
        path = environ.get("PATH_INFO", "/").lstrip("/")
        bucket, _, key = path.partition("/")
        if method == "GET" and (not key or "list-type" in query or "prefix=" in query):
            kind = "LIST"
        elif method == "POST" and "delete" in query:
            kind = "DELETE"
        else:
            kind = method
        with self._lock:
            self.counts[bucket, kind] += 1
            if kind == "LIST":
                self.lists.append((bucket, query))
        return self.app(environ, start_response)

    def snapshot(self) -> collections.Counter[tuple[str, str]]:
        with self._lock:
            return collections.Counter(self.counts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[Any, RequestCounter, str]:
    """moto's S3 server on a free loopback port, with its requests counted: (the server, to
    `stop()`; its counter; its endpoint `host:port`)."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    wsgi = server._server
    assert wsgi is not None
    counter = RequestCounter(wsgi.app)
    wsgi.app = counter
    return server, counter, f"127.0.0.1:{port}"


def uri(endpoint: str, bucket: str, path: str) -> str:
    """An `s3://` URI of `path` in `bucket` that pyarrow resolves to the server at `endpoint`."""
    return (
        f"s3://testing:testing@{bucket}/{path}"
        f"?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    )
