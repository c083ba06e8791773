"""A hostile apiserver: a raw HTTP/1.1 server on loopback that speaks the Kubernetes list/watch wire format for
Namespaces and any namespaced kinds it is given (`kinds`), honestly or the ways a broken apiserver, proxy or network
does. A test peer: it never ships.

Objects are named by a `Ref`: a namespace's name (str), or (plural, namespace, name) of a namespaced kind; each holds
only its labels (and the resourceVersion of its last change). A namespaced kind is served cluster-wide
(`/apis/G/V/PLURAL`) and per namespace (`/apis/G/V/namespaces/NS/PLURAL`); a list honours `limit` and `continue`
(a token from before the last compaction gets 410, as a real apiserver's expired continue does), and serves the
state at the first page's resourceVersion.

Honest answers: `GET /api/v1/namespaces?labelSelector=k=v` (or `fieldSelector=metadata.name=NS`) is a NamespaceList
with `metadata.resourceVersion`; with `watch=true&resourceVersion=RV` it is a chunked stream of newline-delimited
events: the changes after RV, as a label-selected watch sees them (a namespace labelled out of the selector arrives
as DELETED), then live changes until `timeoutSeconds`. Without a resourceVersion a watch first sends ADDED for each
match. A resourceVersion from before the last compaction (`go_honest`), or one it never issued, gets the 410 ERROR
event a real apiserver sends.

Bad objects: `set_spec(ref, raw)` gives an object a spec of raw JSON bytes, served as they are in lists and honest
watches (nested deeper than Python's json module writes, huge, of the wrong shape), as an apiserver serves what it
admitted.

Hostile answers: each request takes the next behaviour from `script` (cycled) while one is set. Written on raw
asyncio streams so it can do what a framework would not (reset, cut a chunk, send a line that never ends).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client as k8s

from support.loopback_peer import LoopbackPeer

Behaviour = tuple[Any, ...]
HONEST: Behaviour = ("honest",)
Ref = Any  # str (a Namespace's name) or tuple[str, str, str] (plural, namespace, name)
NAMESPACES: dict[str, tuple[str, str]] = {"namespaces": ("v1", "Namespace")}

GONE_STATUS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired",
               "message": "too old resource version", "code": 410}


def status_body(code: int) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": f"the server says {code}", "reason": "Whatever", "code": code}).encode()


# Bodies of an answer with an error status ("endless": a body with no length that never ends).
STATUS_BODIES: dict[str, bytes | None] = {
    "none": b"", "status": None, "html": b"<html><body>502 Bad Gateway</body></html>", "broken_json": b'{"kind": "Sta',
    "status_wrong_types": b'{"kind": 5, "code": "410", "message": ["x"]}', "endless": None,
}
# 200 answers to a list that are not a NamespaceList.
GARBAGE_LISTS: tuple[bytes, ...] = (
    b"", b"not json at all", b"[]", b"null", b'"NamespaceList"', b"{}", b'{"items": []}',
    b'{"metadata": {"resourceVersion": "5"}, "items": "many"}',
    b'{"metadata": {"resourceVersion": 5}, "items": []}',
    b'{"metadata": "x", "items": []}',
    b'{"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": 7}}]}',
    b'{"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "ok", "labels": ["a"]}}]}',
    b'{"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "ok", "labels": {"a": 1}}}]}',
    b'{"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "Not A Name"}}]}',
    b'{"metadata": {"resourceVersion": "5"}, "items": [null]}',
    b'{"kind": "Status", "code": 410, "reason": "Expired"}',
    b'{"metadata": {"resourceVersion": "5"}, "items": [' + b"[" * 50000,
    b"[" * 100000 + b"]" * 100000,
    b'{"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "\\ud800"}}]}',
)
TRANSPORT: tuple[str, ...] = ("reset", "close", "bad_status_line", "hang", "hang_after_headers", "truncated",
                              "bad_chunk", "endless_line", "huge_line", "empty_200", "not_chunked")
ENDS = ("end", "hang", "honest", "cut")  # how an `events` answer goes on after its lines


def namespace_object(name: str, labels: dict[str, str], rv: int) -> dict[str, Any]:
    return {"kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)), "resourceVersion": str(rv),
                         "labels": dict(labels)},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


_SPEC_MARK = "@@spec@@"
_SPEC_RE = re.compile(rb'"@@spec@@(\d+)@@spec@@"')


def object_for(kinds: dict[str, tuple[str, str]], ref: Ref, labels: dict[str, str], rv: int) -> dict[str, Any]:
    if isinstance(ref, str):
        return namespace_object(ref, labels, rv)
    plural, namespace, name = ref
    api_version, kind = kinds[plural]
    return {"kind": kind, "apiVersion": api_version,
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv), "labels": dict(labels),
                         "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{plural}.{namespace}.{name}"))},
            "status": {"observed": rv}}


Scope = tuple[str, str | None]  # (plural, namespace or None: all namespaces)


def _scope(kinds: dict[str, tuple[str, str]], path: str) -> Scope | None:
    """The plural and namespace a request's path asks for; None where this peer serves no such path."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"] and len(parts) >= 3:
        group_version, rest = parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    if rest == ["namespaces"]:
        scope: Scope = ("namespaces", None)
    elif len(rest) == 1:
        scope = (rest[0], None)
    elif len(rest) == 3 and rest[0] == "namespaces":
        scope = (rest[2], rest[1])
    else:
        return None
    served = kinds.get(scope[0])
    return scope if served is not None and served[0] == group_version else None


def _in_scope(scope: Scope, ref: Ref) -> bool:
    if isinstance(ref, str):
        return scope[0] == "namespaces"
    return ref[0] == scope[0] and scope[1] in (None, ref[1])


def _matches(query: dict[str, str], ref: Ref, labels: dict[str, str] | None, scope: Scope = ("namespaces", None)
             ) -> bool:
    if labels is None or not _in_scope(scope, ref):
        return False
    name = ref if isinstance(ref, str) else ref[2]
    field = query.get("fieldSelector", "")
    if field and field != f"metadata.name={name}":
        return False
    for term in filter(None, query.get("labelSelector", "").split(",")):
        key, eq, value = term.partition("=")
        if (labels.get(key) != value.lstrip("=")) if eq else key not in labels:
            return False
    return True


class HostileApiserver(LoopbackPeer):
    name = "hostile-apiserver"

    def __init__(self, hang_s: float = 5.0, huge_line_bytes: int = 1 << 20, endless_cap: int = 48 << 20,
                 poll_s: float = 0.02, kinds: dict[str, tuple[str, str]] | None = None):
        self.hang_s, self.huge_line_bytes, self.endless_cap, self.poll_s = hang_s, huge_line_bytes, endless_cap, poll_s
        self.kinds = {**NAMESPACES, **(kinds or {})}  # plural -> (apiVersion, kind)
        self.truth: dict[Ref, dict[str, str]] = {}
        self.object_rv: dict[Ref, int] = {}
        self.rv = 100
        self.compacted = 0  # watches from a resourceVersion below this get 410
        # (resourceVersion, ref, labels before, labels after): the true changes, for honest watches and lists
        self.changes: list[tuple[int, Ref, dict[str, str] | None, dict[str, str] | None]] = []
        self.script: list[Behaviour] = []
        self.requests: list[tuple[float, str, str]] = []  # (time.monotonic(), "list" | "watch", behaviour)
        self.endless: list[tuple[int, bool]] = []  # bytes written to each endless answer, and whether the cap was hit
        self.scripted_lines_sent = threading.Event()  # an `events` answer wrote its lines (or the client hung up)
        self._index = 0
        self._cycle = True
        self._lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()
        self.specs: dict[Ref, int] = {}  # a namespaced object's spec (set_spec): its index in _raw_specs
        self._raw_specs: list[bytes] = []
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def configuration(self) -> k8s.Configuration:
        """A client's configuration pointing at this peer (plain HTTP, no credentials)."""
        return k8s.Configuration(host=self.url)

    # -- what the test drives -----------------------------------------------------------------------------------
    def put(self, name: Ref, labels: dict[str, str] | None) -> None:
        """Create, relabel (labels) or delete (None) a namespace: a true change, seen by lists and honest watches."""
        with self._lock:
            self._put(name, labels)

    def _put(self, name: Ref, labels: dict[str, str] | None) -> None:
        before = self.truth.get(name)
        if before == labels:
            return
        self.rv += 1
        if labels is None:
            self.truth.pop(name, None)
            self.object_rv.pop(name, None)
        else:
            self.truth[name] = dict(labels)
            self.object_rv[name] = self.rv
        self.changes.append((self.rv, name, before, None if labels is None else dict(labels)))

    def set_truth(self, truth: dict[Ref, dict[str, str]]) -> None:
        """Make `truth` the state in one step: no list sees half of it."""
        with self._lock:
            for name in sorted(set(self.truth) - set(truth), key=repr):
                self._put(name, None)
            for name, labels in sorted(truth.items(), key=repr):
                self._put(name, labels)

    def set_spec(self, name: Ref, raw: bytes | None) -> None:
        """Serve `raw` (JSON bytes, not checked) as the object's spec from now on (None: no spec)."""
        with self._lock:
            if raw is None:
                self.specs.pop(name, None)
            else:
                self.specs[name] = len(self._raw_specs)
                self._raw_specs.append(raw)

    def _object(self, ref: Ref, labels: dict[str, str], rv: int) -> dict[str, Any]:
        obj = object_for(self.kinds, ref, labels, rv)
        if ref in self.specs:
            obj["spec"] = f"{_SPEC_MARK}{self.specs[ref]}{_SPEC_MARK}"  # replaced by the raw bytes in _dumps
        return obj

    def _dumps(self, doc: Any) -> bytes:
        out = json.dumps(doc).encode()
        if _SPEC_MARK.encode() not in out:
            return out
        return _SPEC_RE.sub(lambda m: self._raw_specs[int(m.group(1))], out)

    def set_script(self, script: list[Behaviour], cycle: bool = True) -> None:
        """Misbehave from now on: each request takes the next behaviour of `script` (cycled, or honest once it is
        used up); connections open now are cut (the peer 'restarts')."""
        with self._lock:
            self.script, self._index, self._cycle = list(script), 0, cycle
        self.cut_connections()

    def go_honest(self, truth: dict[Ref, dict[str, str]] | None = None) -> None:
        """Behave from now on: forget every resourceVersion handed out so far (a compaction), make `truth` the state,
        and cut every connection."""
        with self._lock:
            self.script = []
            self.rv += 1
            self.compacted = self.rv
            if truth is not None:
                for name in sorted(set(self.truth) - set(truth), key=repr):
                    self._put(name, None)
                for name, labels in sorted(truth.items(), key=repr):
                    self._put(name, labels)
        self.cut_connections()

    def cut_connections(self) -> None:
        if self._loop is None:
            return

        async def cut() -> None:
            for writer in list(self._writers):
                writer.close()
        asyncio.run_coroutine_threadsafe(cut(), self._loop).result(5)

    def objects(self) -> dict[tuple[str, str, str], str]:
        """The namespaced objects now: (kind, namespace, name) -> resourceVersion."""
        with self._lock:
            return {(self.kinds[ref[0]][1], ref[1], ref[2]): str(self.object_rv[ref]) for ref in self.truth
                    if not isinstance(ref, str)}

    def listed_then_watched(self, since: float) -> bool:
        """Whether a list and then a watch were asked for since `since`: the client has handled a list answered then
        (it watches only once it has)."""
        with self._lock:
            kinds = [kind for t, kind, _ in self.requests if t >= since]
        return "list" in kinds and "watch" in kinds[kinds.index("list"):]

    def requests_between(self, start: float, end: float) -> int:
        with self._lock:
            return sum(1 for t, _, _ in self.requests if start <= t <= end)

    # -- HTTP ---------------------------------------------------------------------------------------------------
    def _next(self, kind: str) -> Behaviour:
        with self._lock:
            if self.script and (self._cycle or self._index < len(self.script)):
                behaviour = self.script[self._index % len(self.script)]
                self._index += 1
            else:
                behaviour = HONEST
            self.requests.append((time.monotonic(), kind, str(behaviour[0])))
            return behaviour

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.decode("latin-1").split("\r\n")[0].split(" ")[1]
            url = urlsplit(target)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            watching = query.get("watch") in ("true", "1")
            scope = _scope(self.kinds, url.path)
            if scope is None:
                await self._send(writer, 404, status_body(404))
                return
            behaviour = self._next("watch" if watching else "list")
            if watching:
                await self._watch(writer, query, behaviour, scope)
            else:
                await self._list(writer, query, behaviour, scope)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError, IndexError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, length: int | None = None,
                    headers: str = "") -> None:
        head = (f"HTTP/1.1 {status} Whatever\r\ncontent-type: application/json\r\nconnection: close\r\n{headers}"
                f"content-length: {len(body) if length is None else length}\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()

    async def _chunked_head(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        await writer.drain()

    async def _chunk(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        if writer.is_closing():
            raise ConnectionResetError("cut")
        writer.write(b"%x\r\n" % len(data) + data + b"\r\n")
        await writer.drain()

    async def _end(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _common(self, writer: asyncio.StreamWriter, behaviour: Behaviour) -> bool:
        """The behaviours that are the same for a list and a watch; False when `behaviour` is not one of them."""
        kind = behaviour[0]
        if await self._break_connection(writer, kind):
            return True
        if kind == "hang":
            await asyncio.sleep(self.hang_s)
            return True
        if kind == "slow":  # an honest answer, late (the caller goes on with it)
            await asyncio.sleep(behaviour[1])
            return False
        if kind == "hang_after_headers":
            await self._chunked_head(writer)
            await asyncio.sleep(self.hang_s)
            return True
        if kind == "bad_chunk":
            await self._chunked_head(writer)
            writer.write(b"zz\r\n{}\r\n")
            await writer.drain()
            return True
        if kind == "endless_line":
            await self._chunked_head(writer)
            await self._endless(writer, chunked=True)
            return True
        if kind == "status":
            _, code, body_kind, retry_after = behaviour
            extra = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
            if body_kind == "endless":
                writer.write(f"HTTP/1.1 {code} Whatever\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             f"{extra}\r\n".encode())
                await self._endless(writer, chunked=False)
            else:
                body = STATUS_BODIES[body_kind]
                await self._send(writer, code, status_body(code) if body is None else body, headers=extra)
            return True
        return False

    async def _endless(self, writer: asyncio.StreamWriter, chunked: bool) -> None:
        """Bytes without a newline until the client hangs up (or the cap: a client that never would)."""
        sock = writer.get_extra_info("socket")
        if sock is not None:  # small buffers, so that what the client did not read stays small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        block, written = b"x" * 65536, 0
        try:
            while written < self.endless_cap and not writer.is_closing():
                writer.write(b"%x\r\n" % len(block) + block + b"\r\n" if chunked else block)
                await writer.drain()
                written += len(block)
        except ConnectionError:
            pass
        with self._lock:
            self.endless.append((written, written >= self.endless_cap))

    def _list_body(self, query: dict[str, str], scope: Scope = ("namespaces", None)) -> bytes | None:
        """An honest list page: the state at the list's resourceVersion (replayed from the changes), from the
        `continue` token's offset, at most `limit` items; None for a token from before the last compaction."""
        with self._lock:
            rv, offset = self.rv, 0
            token = query.get("continue", "")
            if token:
                at, _, start = token.partition(":")
                if not (at.isdigit() and start.isdigit()) or int(at) < self.compacted:
                    return None
                rv, offset = int(at), int(start)
            state: dict[Ref, tuple[dict[str, str], int]] = {}
            for crv, ref, _before, after in self.changes:
                if crv > rv:
                    break
                if after is None:
                    state.pop(ref, None)
                else:
                    state[ref] = (after, crv)
            matching = [(ref, labels, orv) for ref, (labels, orv) in sorted(state.items(), key=lambda i: repr(i[0]))
                        if _matches(query, ref, labels, scope)]
        limit = int(query["limit"]) if query.get("limit", "").isdigit() and int(query["limit"]) > 0 else None
        page = matching[offset:offset + limit] if limit else matching[offset:]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and offset + limit < len(matching):
            meta["continue"] = f"{rv}:{offset + limit}"
        api_version, kind = self.kinds[scope[0]]
        return self._dumps({"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta,
                            "items": [self._object(ref, labels, orv) for ref, labels, orv in page]})

    async def _list(self, writer: asyncio.StreamWriter, query: dict[str, str], behaviour: Behaviour,
                    scope: Scope = ("namespaces", None)) -> None:
        if await self._common(writer, behaviour):
            return
        kind = behaviour[0]
        honest = self._list_body(query, scope)
        if honest is None:  # an expired continue token
            await self._send(writer, 410, json.dumps(GONE_STATUS).encode())
            return
        if kind == "list_body":
            await self._send(writer, 200, behaviour[1])
        elif kind == "huge_line":
            await self._send(writer, 200, b" " * self.huge_line_bytes + honest)
        elif kind == "truncated":
            await self._send(writer, 200, honest[: len(honest) // 2], length=len(honest))
        elif kind == "empty_200":
            await self._send(writer, 200, b"")
        elif kind == "not_chunked":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
                         + honest)
            await writer.drain()
        else:  # honest, and the watch-only behaviours
            await self._send(writer, 200, honest)

    def _events_after(self, query: dict[str, str], cursor: int, scope: Scope = ("namespaces", None)
                      ) -> tuple[list[bytes], int]:
        """The honest watch events after `cursor`, as this watch's selector sees them."""
        lines = []
        with self._lock:
            for rv, name, before, after in self.changes:
                if rv <= cursor:
                    continue
                was, now = _matches(query, name, before, scope), _matches(query, name, after, scope)
                kind = "ADDED" if now and not was else "MODIFIED" if now else "DELETED" if was else None
                if kind is not None:
                    labels = after if after is not None else before or {}
                    obj = self._object(name, labels, rv)
                    lines.append({"type": kind, "object": obj})
                cursor = rv
            cursor = max(cursor, self.rv)
        return [self._dumps(line) for line in lines], cursor

    async def _honest_watch(self, writer: asyncio.StreamWriter, query: dict[str, str], head_sent: bool = False,
                            scope: Scope = ("namespaces", None)) -> None:
        if not head_sent:
            await self._chunked_head(writer)
        asked = query.get("resourceVersion", "")
        with self._lock:
            now_rv, compacted = self.rv, self.compacted
            initial = [{"type": "ADDED", "object": self._object(n, labels, self.object_rv[n])}
                       for n, labels in sorted(self.truth.items(), key=repr)
                       if _matches(query, n, labels, scope)]
        if asked in ("", "0"):
            for line in initial:
                await self._chunk(writer, self._dumps(line) + b"\n")
            cursor = now_rv
        elif not asked.isdigit() or not compacted <= int(asked) <= now_rv:
            await self._chunk(writer, json.dumps({"type": "ERROR", "object": GONE_STATUS}).encode() + b"\n")
            await self._end(writer)
            return
        else:
            cursor = int(asked)
        deadline = time.monotonic() + float(query.get("timeoutSeconds", "300") or 300)
        while time.monotonic() < deadline:
            lines, cursor = self._events_after(query, cursor, scope)
            for line in lines:
                await self._chunk(writer, line + b"\n")
            if writer.is_closing():
                return
            await asyncio.sleep(self.poll_s)
        await self._end(writer)

    async def _watch(self, writer: asyncio.StreamWriter, query: dict[str, str], behaviour: Behaviour,
                     scope: Scope = ("namespaces", None)) -> None:
        if await self._common(writer, behaviour):
            return
        kind = behaviour[0]
        if kind == "list_body":  # a watch answered with a plain body, no chunks, then closed
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
                         + behaviour[1])
            await writer.drain()
        elif kind == "empty_200":
            await self._chunked_head(writer)
            await self._end(writer)
        elif kind == "huge_line":
            await self._chunked_head(writer)
            block = b" " * 65536
            for _ in range(self.huge_line_bytes // len(block) + 1):
                await self._chunk(writer, block)
            await self._chunk(writer, b"\n")
            await self._honest_watch(writer, query, head_sent=True, scope=scope)
        elif kind == "truncated":  # the honest stream, cut in the middle of a line and of a chunk
            await self._chunked_head(writer)
            writer.write(b"40\r\n" + b'{"type": "MODIFIED", "object": {"metadata": ')
            await writer.drain()
        elif kind == "not_chunked":  # honest events on a body without chunks, closed after them
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n")
            with self._lock:
                lines = [{"type": "ADDED", "object": self._object(n, labels, self.object_rv[n])}
                         for n, labels in sorted(self.truth.items(), key=repr)
                         if _matches(query, n, labels, scope)]
            writer.write(b"".join(self._dumps(line) + b"\n" for line in lines))
            await writer.drain()
        elif kind == "events":
            _, lines, then = behaviour
            await self._chunked_head(writer)
            try:
                for line in lines:
                    await self._chunk(writer, line + b"\n")
            finally:  # all written, or the client hung up (after an ERROR event, say)
                self.scripted_lines_sent.set()
            if then == "end":
                await self._end(writer)
            elif then == "hang":
                await asyncio.sleep(self.hang_s)
            elif then == "honest":
                await self._honest_watch(writer, query, head_sent=True, scope=scope)
            # "cut": closed without the last chunk
        else:
            await self._honest_watch(writer, query, scope=scope)


def module_peer(**options: Any) -> Any:
    """A module-scoped `peer` fixture: one HostileApiserver(**options) for every test of the module
    (`peer = module_peer(kinds=...)` at module level)."""

    @pytest.fixture(scope="module")
    def peer() -> Iterator[HostileApiserver]:
        p = HostileApiserver(**options).start()
        yield p
        p.stop()

    return peer
