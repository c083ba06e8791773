"""`kubectl arbiter dashboard`: serves the pages on this machine and keeps them live.

- Reads only, as the user: the kubeconfig's credentials (and --as), watches of DecisionModels and Events in the
  namespace (or all with -A), Prometheus queries for the models whose page is open (`--prometheus`). A source the user
  may not read is named on the page; the rest still shows.
- Bound to 127.0.0.1 by default; a request whose Host is not this server's address is refused (a page from elsewhere
  cannot reach it through DNS rebinding and read the cluster with the user's credentials). GET only; the pages send
  a Content-Security-Policy allowing nothing but this server.
- Live: each page listens on /events (Server-Sent Events) and fetches itself again when the store changes: a watch
  event, a new Event, fresh numbers from Prometheus (read every 15 s for pages open in the last minute).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO
from urllib.parse import parse_qs, unquote, urlsplit

from ..cluster import CliError, Cluster
from ..promclient import Prometheus, PrometheusError
from .metrics import model_metrics
from .render import CSS, JS, model_page, overview
from .store import Key, Store

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PROMETHEUS_EVERY_S = 15.0
VIEWED_WITHIN_S = 60.0
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Dashboard:
    """The store, the threads that fill it and the HTTP server that shows it."""

    def __init__(self, cluster: Cluster, all_namespaces: bool, prometheus: str | None, window_s: float,
                 address: str = "127.0.0.1", port: int = 0, metrics_token: str | None = None) -> None:
        self.cluster, self.all_namespaces, self.window_s = cluster, all_namespaces, window_s
        token = metrics_token or cluster.bearer_token()
        self.prometheus = Prometheus(prometheus, token, cluster.timeout or 10.0) if prometheus else None
        self.store = Store()
        self.stopping = threading.Event()
        self.http = ThreadingHTTPServer((address, port), _handler(self))
        self.http.daemon_threads = True
        host, bound = str(self.http.server_address[0]), int(self.http.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}/"
        self.allowed_hosts = {f"{shown}:{bound}", f"localhost:{bound}", f"127.0.0.1:{bound}", f"[::1]:{bound}"}
        # Bound elsewhere on purpose (--address): reached by whatever name the network gives this machine.
        self.check_host = address in LOOPBACK
        self._threads: list[threading.Thread] = []

    def start(self) -> Dashboard:
        scope = None if self.all_namespaces else self.cluster.namespace
        for name, target in (("models", self._models), ("events", lambda: self._events(scope)),
                             ("prometheus", self._prometheus), ("http", self.http.serve_forever)):
            t = threading.Thread(target=target, name=f"dashboard-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.http.shutdown()
        self.http.server_close()
        if self.prometheus is not None:
            self.prometheus.close()

    # -- feeding the store ---------------------------------------------------------------------------------------
    def _retrying(self, source: str, body: Callable[[], None]) -> None:
        """Run `body` (a list then watches) again and again; after a failure wait 1, 2, 4 ... 30 s."""
        delay = 1.0
        while not self.stopping.is_set():
            try:
                body()
                delay = 1.0
            except CliError as exc:
                self.store.set_problem(source, str(exc))
                self.stopping.wait(delay)
                delay = min(delay * 2, 30.0)

    def _models(self) -> None:
        def once() -> None:
            objs, version = self.cluster.list_models(self.all_namespaces)
            self.store.replace_all(objs, time.time())
            self.store.set_problem("DecisionModels", None)
            while not self.stopping.is_set():
                for kind, obj in self.cluster.watch(all_namespaces=self.all_namespaces, resource_version=version,
                                                    seconds=300):
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    meta = obj["metadata"]
                    if kind == "DELETED":
                        self.store.delete((meta["namespace"], meta["name"]))
                    else:
                        self.store.put(obj, time.time())

        self._retrying("DecisionModels", once)

    def _events(self, namespace: str | None) -> None:
        def once() -> None:
            items, version = self.cluster.list_events(namespace)
            for e in sorted(items, key=lambda e: str((e.get("metadata") or {}).get("resourceVersion") or "")):
                self.store.add_event(e)
            self.store.set_problem("Events", None)
            while not self.stopping.is_set():
                for kind, e in self.cluster.watch_events(namespace, version, seconds=300):
                    version = str((e.get("metadata") or {}).get("resourceVersion") or version)
                    if kind != "DELETED":
                        self.store.add_event(e)

        self._retrying("Events", once)

    def _prometheus(self) -> None:
        while self.prometheus is not None and not self.stopping.is_set():
            self.refresh_metrics()
            self.stopping.wait(PROMETHEUS_EVERY_S)

    def refresh_metrics(self, only: Key | None = None) -> None:
        if self.prometheus is None:
            return
        now = time.time()
        keys = [only] if only else [k for k, t in list(self.store.viewed.items()) if now - t < VIEWED_WITHIN_S]
        for key in keys:
            snap = self.store.snapshot(key)
            try:
                found = model_metrics(self.prometheus, key, snap["model"], self.window_s, now)
                self.store.set_problem("Prometheus", None)
            except PrometheusError as exc:
                self.store.set_problem("Prometheus", str(exc))
                continue
            self.store.set_metrics(key, found)

    # -- pages -------------------------------------------------------------------------------------------------------
    def render(self, path: str) -> tuple[int, str, str]:
        """(status, content type, body) for one GET."""
        parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
        if not parts:
            return 200, "text/html; charset=utf-8", overview(self.store.snapshot(), time.time())
        if parts[0] == "m" and len(parts) == 3:
            key = (parts[1], parts[2])
            first_view = key not in self.store.viewed
            self.store.mark_viewed(key)
            if first_view and self.prometheus is not None:
                self.refresh_metrics(key)
            return 200, "text/html; charset=utf-8", model_page(key, self.store.snapshot(key), time.time(),
                                                               self.prometheus is not None)
        if parts == ["app.css"]:
            return 200, "text/css; charset=utf-8", CSS
        if parts == ["app.js"]:
            return 200, "text/javascript; charset=utf-8", JS
        if parts == ["healthz"]:
            return 200, "text/plain; charset=utf-8", "ok\n"
        return 404, "text/plain; charset=utf-8", "not found\n"

    def changes(self, since: int) -> Iterator[int]:
        """Store versions as they change, for one /events stream; a heartbeat (the same version) every 15 s."""
        seen = since
        while not self.stopping.is_set():
            seen = self.store.wait_change(seen, 15.0)
            yield seen


def _handler(dash: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "arbiter-dashboard"

        def log_message(self, *_: Any) -> None:  # the terminal is the user's; no access log there
            pass

        def _send(self, status: int, ctype: str, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in SECURITY_HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if dash.check_host and self.headers.get("Host") not in dash.allowed_hosts:
                self._send(403, "text/plain; charset=utf-8", "this dashboard answers only at its own address\n")
                return
            url = urlsplit(self.path)
            if url.path == "/events":
                self._events(url.query)
                return
            try:
                self._send(*dash.render(url.path))
            except Exception as exc:  # a page that cannot be made says why; the server keeps serving
                self._send(503, "text/plain; charset=utf-8", f"cannot show this page now: {type(exc).__name__}\n")

        def _events(self, query: str) -> None:
            try:
                since = int((parse_qs(query).get("since") or ["-1"])[0])
            except ValueError:
                since = -1
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            try:
                for version in dash.changes(since):
                    self.wfile.write(f"data: {version}\n\n".encode())
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _refuse(self) -> None:
            self._send(405, "text/plain; charset=utf-8", "read-only: GET only\n")

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    return Handler


def run(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    dash = Dashboard(cluster, args.all_namespaces, args.prometheus, args.window, args.address, args.port,
                     args.metrics_token).start()
    scope = "all namespaces" if args.all_namespaces else f"namespace {cluster.namespace}"
    print(f"Arbiter dashboard for {scope} at {dash.url} (read-only, as your kubeconfig user; Ctrl-C stops it)",
          file=out, flush=True)
    if args.address not in LOOPBACK:
        print(f"note: listening on {args.address}: anyone who reaches it reads what your credentials can", file=out)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        dash.stop()
    return 0
