"""A `http.server` request handler class served on loopback in a daemon thread, for the tests' small stand-ins (an
apiserver's reviews, a Prometheus, a hostile upstream):

    with serving(Handler) as url:   # "http://127.0.0.1:<port>"
        ...

and `answer(handler, status, body)` writes one whole answer from a handler's `do_GET`/`do_POST`.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True, name=handler.__name__).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def answer(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes,
           content_type: str = "application/json") -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
