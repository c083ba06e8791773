"""A `http.server` request handler class served on loopback in a daemon thread, for the tests' small stand-ins (an
apiserver's reviews, a Prometheus, a hostile upstream):

    with serving(Handler) as url:   # "http://127.0.0.1:<port>"
        ...
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
