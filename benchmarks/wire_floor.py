"""The wire's floor for the operator's CPU: the least CPU a Python process on the operator's own stack (uvloop,
aiohttp, orjson, msgspec) spends to hear what the operator hears and to write what it writes for a fleet, with no
operator logic at all. It sets the scale benchmark's "operator CPU per DecisionModel" beside what the protocol alone
costs on the same machine.

    .venv/bin/python benchmarks/wire_floor.py [--count 200] [--namespaces 20] [--writers 16] [--client aiohttp|raw]
                                              [--watch all|listed]

How: the operator converges one template DecisionModel and is stopped; its writes are read back as the convergence
benchmark's floor reads them (convergence.Floor: children as written, statuses as a watch saw them, Events). A
separate process, the *replayer* (this file with `--replay`), then runs under the operator's ServiceAccount token
and holds the operator's watches: every kind of app.WATCHED with the same label selectors, cluster-wide
(`--watch all`, the chart's default and benchmarks/scale.py's) or in each namespace (`--watch listed`), listed and
then watched with bookmarks. Of each watch line it reads the event's head as the operator's watches do
(`kubejson.event_head`), and decodes whole only InferenceService lines (to see KServe's Ready), a new
DecisionModel's (for its uid) and lines without such a head (bookmarks). On a new DecisionModel it
replays the template's first pass with the names and owner uid swapped (the same server-side applies, status patch
and Event, `--writers` at a time like the operator's workers); once KServe has marked its InferenceServices Ready it
replays the later ones (less a status-only pass in between, the template's predictor seen loading: at fleet scale
the operator makes two passes per DecisionModel, and so does the replayer). No validation, planning, cache, metrics
or logging: what is left is the HTTP, TLS and JSON that any client of these watches and writes pays. The replayer's
CPU from /proc, between its watches being listed and the last write of the last DecisionModel, divided by the
count, is the floor; its requests are counted in the audit log under the operator's user, as the scale benchmark
counts the operator's.

`--client raw` replaces aiohttp by HTTP/1.1 written by hand over uvloop's TLS transports with httptools parsing the
answers: what is left when no HTTP library is in the way, i.e. how much of the floor is aiohttp's.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import fleet

ISVC_KIND = "InferenceService"


# -- the replayer (its own process: nothing of the benchmark's harness is in its CPU) --------------------------------

class AiohttpWire:
    """The operator's own HTTP stack: its aiohttp session (kube/transport.py, `new_session`: C parser, no cookie
    jar, no decompression) with its credentials headers, as its requests and kube/watch.py use them."""

    def __init__(self, config: Any) -> None:
        import aiohttp
        from arbiter_operator.kube import transport as aiokube

        self.base = config.host.rstrip("/")
        self.auth = aiokube.auth_headers(config)
        self.session = aiokube.new_session(config, aiohttp.ClientTimeout(total=None, sock_read=330))

    async def request(self, method: str, path: str, query: dict[str, str], body: str | None,
                      content_type: str | None) -> tuple[int, bytes]:
        headers = {**self.auth, "Content-Type": content_type} if content_type else self.auth
        async with self.session.request(method, self.base + path, params=query, data=body, headers=headers) as resp:
            return resp.status, await resp.read()

    async def watch(self, path: str, query: dict[str, str], on_line: Any) -> None:
        async with self.session.get(self.base + path, params=query, headers=self.auth) as resp:
            rest = b""
            while chunk := await resp.content.readany():  # as kube/watch.py reads them: chunks, split here
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    on_line(line)

    async def close(self) -> None:
        await self.session.close()


class RawWire:
    """No HTTP library: HTTP/1.1 written by hand over uvloop's TLS transports, answers parsed by httptools (llhttp,
    uvicorn's parser), keep-alive connections reused. Only to measure how far under aiohttp a client could go; not
    a client to ship (no redirects, proxies, retries or bounds)."""

    def __init__(self, config: Any) -> None:
        from urllib.parse import urlsplit

        from arbiter_operator.kube import transport as aiokube

        url = urlsplit(config.host)
        self.host, self.port, self.ctx = url.hostname or "", url.port or 443, aiokube.ssl_context(config)
        auth = "".join(f"{k}: {v}\r\n" for k, v in aiokube.auth_headers(config).items())
        self.headers = f"Host: {url.netloc}\r\n{auth}Accept-Encoding: identity\r\nUser-Agent: wire-floor\r\n"
        self.idle: list[Any] = []

    async def _connect(self) -> Any:
        import httptools

        loop = asyncio.get_running_loop()

        class Conn(asyncio.Protocol):
            def __init__(self) -> None:
                self.parser = httptools.HttpResponseParser(self)
                self.done: asyncio.Future | None = None
                self.on_line: Any = None
                self.chunks: list[bytes] = []
                self.rest = b""

            def connection_made(self, transport: Any) -> None:
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                self.parser.feed_data(data)

            def on_body(self, body: bytes) -> None:
                if self.on_line is None:
                    self.chunks.append(body)
                    return
                *lines, self.rest = (self.rest + body).split(b"\n")
                for line in lines:
                    self.on_line(line)

            def on_message_complete(self) -> None:
                if self.done is not None and not self.done.done():
                    self.done.set_result((self.parser.get_status_code(), b"".join(self.chunks)))

            def connection_lost(self, exc: Exception | None) -> None:
                if self.done is not None and not self.done.done():
                    self.done.set_exception(ConnectionError("connection lost"))

        _, conn = await loop.create_connection(Conn, self.host, self.port, ssl=self.ctx, server_hostname=self.host)
        return conn

    async def _exchange(self, method: str, path: str, query: dict[str, str], body: str | None,
                        content_type: str | None, on_line: Any = None) -> tuple[int, bytes]:
        from urllib.parse import urlencode

        conn = self.idle.pop() if self.idle else await self._connect()
        data = body.encode() if body is not None else b""
        head = f"{method} {path}{'?' + urlencode(query) if query else ''} HTTP/1.1\r\n{self.headers}"
        if content_type:
            head += f"Content-Type: {content_type}\r\n"
        conn.chunks, conn.rest, conn.on_line = [], b"", on_line
        conn.done = asyncio.get_running_loop().create_future()
        conn.transport.writelines((f"{head}Content-Length: {len(data)}\r\n\r\n".encode(), data))
        answer = await conn.done
        self.idle.append(conn)
        return answer

    async def request(self, method: str, path: str, query: dict[str, str], body: str | None,
                      content_type: str | None) -> tuple[int, bytes]:
        return await self._exchange(method, path, query, body, content_type)

    async def watch(self, path: str, query: dict[str, str], on_line: Any) -> None:
        await self._exchange("GET", path, query, None, None, on_line)

    async def close(self) -> None:
        for conn in self.idle:
            conn.transport.close()


def replay(spec_path: str) -> int:
    import orjson
    import uvloop
    from arbiter_operator.api.kubejson import event_head
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    spec = json.loads(Path(spec_path).read_text())
    config = k8s.Configuration()
    k8s_config.load_kube_config(config_file=spec["kubeconfig"], client_configuration=config)
    template, template_ns, template_uid = spec["template"], spec["template_ns"], spec["template_uid"]
    passes: list[list[dict[str, Any]]] = spec["passes"]
    isvcs_of_template: list[str] = spec["isvcs"]
    counts = {"events": 0, "writes": 0, "failed": 0, "watch_errors": 0}

    async def main() -> None:
        wire = (RawWire if spec["client"] == "raw" else AiohttpWire)(config)
        writers = asyncio.Semaphore(spec["writers"])
        state: dict[tuple[str, str], dict[str, Any]] = {}  # a DecisionModel: its uid, pass, InferenceServices
        isvc_owner: dict[tuple[str, str], tuple[str, str]] = {}
        ready_isvcs: set[tuple[str, str]] = set()

        async def send(w: dict[str, Any], ns: str, name: str, uid: str) -> None:
            swap = lambda s: s.replace(template, name).replace(template_ns, ns).replace(template_uid, uid)  # noqa
            async with writers:
                status, _ = await wire.request(w["method"], swap(w["path"]), w["query"], swap(w["body"]),
                                               w["content_type"])
            counts["writes"] += 1
            if status >= 400:
                counts["failed"] += 1

        async def run_pass(key: tuple[str, str], i: int) -> None:
            st = state[key]
            for w in passes[i]:
                await send(w, key[0], key[1], st["uid"])
            st["done"] = i + 1

        async def maybe_next(key: tuple[str, str]) -> None:
            """The later passes, one after the other, once every InferenceService of the DecisionModel is Ready."""
            st = state[key]
            while st["done"] < len(passes) and not st["running"] and all(k in ready_isvcs for k in st["isvcs"]):
                st["running"] = True
                try:
                    await run_pass(key, st["done"])
                finally:
                    st["running"] = False

        def on_decision_model(ns: str, name: str, uid: str) -> None:
            if (ns, name) not in state:
                isvcs = [(ns, n.replace(template, name)) for n in isvcs_of_template]
                state[(ns, name)] = {"uid": uid, "done": 0, "running": True, "isvcs": isvcs}
                for k in isvcs:
                    isvc_owner[k] = (ns, name)

                async def first() -> None:
                    try:
                        await run_pass((ns, name), 0)
                    finally:
                        state[(ns, name)]["running"] = False
                    await maybe_next((ns, name))
                asyncio.get_running_loop().create_task(first()).add_done_callback(report)

        def on_isvc(line: bytes, ns: str, name: str) -> None:
            obj = orjson.loads(line)["object"]
            conds = (obj.get("status") or {}).get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
            if ready and (ns, name) not in ready_isvcs:
                ready_isvcs.add((ns, name))
                owner = isvc_owner.get((ns, name))
                if owner is not None:
                    asyncio.get_running_loop().create_task(maybe_next(owner)).add_done_callback(report)

        async def follow(path: str, kind: str, selector: str | None, listed: asyncio.Event) -> None:
            query = {"labelSelector": selector} if selector else {}
            _, body = await wire.request("GET", path, {**query, "limit": "500"}, None, None)
            rv = orjson.loads(body)["metadata"]["resourceVersion"]
            listed.set()

            def on_line(line: bytes) -> None:
                nonlocal rv
                if not line.strip():
                    return
                counts["events"] += 1
                # What the operator's watches read first; a line without a namespaced object's head (a bookmark,
                # an ERROR) is decoded whole, as theirs is.
                h = event_head(line)
                if h is None:
                    event = orjson.loads(line)
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: the replayer does not relist, the run is void
                        counts["watch_errors"] += 1
                    rv = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion") or rv
                    return
                typ, ns, name, rv = h
                if kind == "DecisionModel" and typ == "ADDED":
                    on_decision_model(ns, name, orjson.loads(line)["object"]["metadata"]["uid"])
                elif kind == ISVC_KIND:
                    on_isvc(line, ns, name)

            while not counts["watch_errors"]:
                await wire.watch(path, {**query, "watch": "1", "allowWatchBookmarks": "true", "resourceVersion": rv,
                                        "timeoutSeconds": "300"}, on_line)
            raise RuntimeError(f"a watch ended with an ERROR event; stopped watching {path}")

        def report(task: asyncio.Task) -> None:  # a replayer that lost a watch or a pass says so at once
            if not task.cancelled() and task.exception() is not None:
                print(f"replayer: {task.exception()!r}", file=sys.stderr, flush=True)

        flags = []
        tasks = []
        for w in spec["watches"]:
            flags.append(asyncio.Event())
            tasks.append(asyncio.create_task(follow(w["path"], w["kind"], w["selector"], flags[-1])))
            tasks[-1].add_done_callback(report)
        for f in flags:
            await f.wait()
        print("listed", flush=True)
        # Until stopped; the benchmark reads what was counted from the answer to each line it sends.
        reader = asyncio.StreamReader()
        await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while await reader.readline():
            print(json.dumps(counts), flush=True)
        for t in tasks:
            t.cancel()
        await wire.close()

    uvloop.run(main())
    return 0


# -- the benchmark ----------------------------------------------------------------------------------------------------

def build_spec(stack: fleet.Stack, floor: Any, template_uid: str, namespaces: list[str] | None,
               writers: int, client: str) -> dict:
    """What the replayer needs: the operator's kubeconfig, its watches (cluster-wide, or in each of `namespaces`), the
    template's passes as requests (names still the template's; the replayer swaps them)."""
    from arbiter_operator.api.times import format_time
    from arbiter_operator.app import WATCHED
    from arbiter_operator.kube.client import CREATE_ONLY_RESOURCE_VERSION, FIELD_MANAGER
    from arbiter_operator.kube.events import event_body
    from arbiter_operator.kube.kinds import KINDS
    from convergence import OP_NS, TEMPLATE

    passes = []
    status_i = 0  # the k-th status write of the template, counted over all its passes (its last is Ready)
    for p in floor.passes:
        writes: list[dict[str, Any]] = []
        for verb, kind, child, extra in p:
            if verb in ("apply", "create"):
                body = json.loads(floor.children[(kind, child)])
                k = next(k for (_av, kn), k in KINDS.items() if kn == kind)
                query = {"fieldManager": FIELD_MANAGER}
                if verb == "create":
                    body["metadata"]["resourceVersion"] = CREATE_ONLY_RESOURCE_VERSION
                else:
                    query["force"] = "true"
                writes.append({"method": "PATCH", "path": k.path(OP_NS, child), "query": query,
                               "content_type": "application/apply-patch+yaml", "body": json.dumps(body)})
            elif verb == "patch-status":
                snap = floor.statuses[len(floor.statuses) - floor.n_status + status_i]
                status_i += 1
                fields = extra.split(",") if extra else list(snap)
                k = next(k for (_av, kn), k in KINDS.items() if kn == "DecisionModel")
                writes.append({"method": "PATCH", "path": k.path(OP_NS, TEMPLATE, "status"),
                               "query": {"fieldManager": FIELD_MANAGER},
                               "content_type": "application/merge-patch+json",
                               "body": json.dumps({"status": {f: snap[f] for f in fields if f in snap}})})
            elif verb == "event":
                involved = {"apiVersion": f"{common.GROUP}/{common.VERSION}", "kind": "DecisionModel",
                            "metadata": {"name": TEMPLATE, "namespace": OP_NS, "uid": template_uid}}
                body = event_body(involved, "Normal", extra, extra, format_time(datetime.now(UTC)))
                writes.append({"method": "POST", "path": KINDS[("v1", "Event")].path(OP_NS), "query": {},
                               "content_type": "application/json", "body": json.dumps(body)})
        passes.append(writes)
    # A status-only pass between the first and the last is the template's predictor seen loading; at fleet scale
    # the operator makes two passes per DecisionModel (benchmarks/scale.py), so the replayer makes the first and
    # the last, as many writes as the operator there.
    passes = [w for i, w in enumerate(passes)
              if i in (0, len(passes) - 1) or any(x["method"] != "PATCH" or not x["path"].endswith("/status")
                                                  for x in w)]
    isvcs = [child for p in floor.passes for verb, kind, child, _ in p
             if verb in ("apply", "create") and kind == ISVC_KIND]
    return {
        "kubeconfig": str(stack.operator_kubeconfig), "writers": writers, "client": client,
        "template": TEMPLATE, "template_ns": OP_NS, "template_uid": template_uid, "isvcs": sorted(set(isvcs)),
        "passes": passes,
        "watches": [{"path": r.path(ns), "kind": r.kind, "selector": r.label}
                    for ns in (namespaces if namespaces is not None else [None]) for r in WATCHED],
    }


def writes_by_request(passes: list[list[dict[str, Any]]]) -> dict[str, int]:
    """The replayer's writes for one DecisionModel, named as the audit log names them ("patch decisionmodels/status").
    The template's passes are what the operator wrote while its predictor came up, which varies with the machine's
    load (a loading status, a second apply): the fleet's requests are compared with these, not with a fixed count."""
    verbs = {"PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}
    out: Counter[str] = Counter()
    for w in (w for p in passes for w in p):
        parts = w["path"].split("/namespaces/", 1)[1].split("/")[1:]  # resource, name, subresource
        out[f"{verbs[w['method']]} {'/'.join(parts[::2])}"] += 1
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--replay":
        return replay(sys.argv[2])
    from convergence import CHILD_API, OP_NS, TEMPLATE, Floor, isvc_ready, run_operator_once

    p = common.add_watch_arg(common.base_parser(__doc__.split("\n\n")[0]))
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--namespaces", type=int, default=20)
    p.add_argument("--writers", type=int, default=16, help="writes in flight at once (the operator's workers)")
    p.add_argument("--threads", type=int, default=8, help="concurrent creating clients (as benchmarks/scale.py)")
    p.add_argument("--client", choices=("aiohttp", "raw"), default="aiohttp",
                   help="aiohttp: the operator's HTTP stack; raw: HTTP/1.1 by hand with httptools, no HTTP library")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for all Ready")
    args = p.parse_args(argv)
    nss = [f"wire-{i:02d}" for i in range(args.namespaces)]
    keys = [(nss[i % len(nss)], f"dm-{i:04d}") for i in range(args.count)]
    result: dict[str, Any] = {"benchmark": "wire-floor", "machine": common.machine(), "args": vars(args)}
    with fleet.Stack([OP_NS], nss, operator_env=common.parse_env(args.operator_env), keep=args.keep,
                      gpu_nodes=args.count // 8 + 2) as stack:
        dm_watch = fleet.Watcher(stack.api, common.GROUP, common.VERSION, common.PLURAL).start()
        isvc_watch = fleet.Watcher(stack.api, *CHILD_API[ISVC_KIND], pred=isvc_ready).start()
        stack.start_operator()
        run_operator_once(stack, dm_watch, TEMPLATE)
        time.sleep(1.0)  # the template's last pass logs its line
        floor = Floor(stack, dm_watch, isvc_watch)
        template_uid = stack.custom().get_namespaced_custom_object(
            common.GROUP, common.VERSION, OP_NS, common.PLURAL, TEMPLATE)["metadata"]["uid"]
        stack.op.stop()
        spec_path = stack.workdir / "wire-floor.json"
        spec = build_spec(stack, floor, template_uid, nss if args.watch == "listed" else None, args.writers,
                          args.client)
        floor.close()  # read for the spec only; the replayer writes on its own connections
        spec_path.write_text(json.dumps(spec))
        common.log("template converged; operator stopped; replaying "
                   + " | ".join("; ".join(p) for p in floor.describe()))
        proc = subprocess.Popen([sys.executable, __file__, "--replay", str(spec_path)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            stdin, stdout = proc.stdin, proc.stdout
            if stdout.readline().strip() != "listed":
                raise RuntimeError("the replayer stopped before its watches were listed")
            stats = common.ProcStats(proc.pid)
            cpu0, sys0 = stats.cpu_seconds(), stats.system_cpu_seconds()
            wall0 = time.time()
            t0 = time.perf_counter()
            fleet.create_many(stack.custom(), keys, args.threads)
            deadline = time.monotonic() + args.timeout
            while not (ok := dm_watch.wait(keys, 15.0)) and time.monotonic() < deadline:
                common.log(f"  {sum(1 for k in keys if k in dm_watch.first)}/{args.count} Ready after "
                           f"{time.perf_counter() - t0:.0f}s, "
                           f"replayer CPU {stats.cpu_seconds() - cpu0:.1f}s")
            ready = sorted(dm_watch.first[k] - t0 for k in keys if k in dm_watch.first)

            def ask() -> dict[str, int]:
                stdin.write("counts\n")
                stdin.flush()
                return json.loads(stdout.readline())

            # A last pass's Event may still be on its way when its Ready status is seen: the replayer is done when
            # it has made every write of every pass (or 10 s later).
            expected = args.count * sum(len(p) for p in spec["passes"])
            counts, until = ask(), time.monotonic() + 10
            while ok and counts["writes"] < expected and time.monotonic() < until:
                time.sleep(0.2)
                counts = ask()
            cpu_s, sys_s = stats.cpu_seconds() - cpu0, stats.system_cpu_seconds() - sys0
            peak = stats.peak_rss()
        finally:
            proc.kill()
            proc.wait()
        dm_watch.stop()
        isvc_watch.stop()
        stack.flush_audit()
        requests = common.audit_requests(stack.audit_log, common.OPERATOR_USER, wall0)
    result.update({
        "all_ready": ok, "all_ready_seconds": ready[-1] if ok else float("nan"),
        "replayer_cpu_seconds": cpu_s, "replayer_system_cpu_seconds": sys_s,
        "replayer_cpu_ms_per_dm": 1000 * cpu_s / args.count, "replayer_peak_rss_mib": peak / 2**20,
        "watch_events_per_dm": counts["events"] / args.count, "writes_per_dm": counts["writes"] / args.count,
        "failed_writes": counts["failed"], "watch_errors": counts["watch_errors"],
        "requests_per_dm": sum(requests.values()) / args.count,
        "requests": common.counter_json(requests), "template_writes": writes_by_request(spec["passes"]),
    })
    print(f"\n## Wire floor: {args.count} DecisionModels in {args.namespaces} namespaces, replayed with no logic "
          f"(watches: {args.watch}, client: {args.client})\n")
    print(common.table(["measure", "value"], [
        ("all Ready (s)", result["all_ready_seconds"]),
        ("replayer CPU per DM (ms): all / in the kernel",
         f"{result['replayer_cpu_ms_per_dm']:.2f} / {1000 * sys_s / args.count:.2f}"),
        ("replayer peak RSS (MiB)", f"{result['replayer_peak_rss_mib']:.1f}"),
        ("watch events per DM (bookmarks included)", f"{result['watch_events_per_dm']:.2f}"),
        ("writes per DM (refused writes, in all)", f"{result['writes_per_dm']:.2f} ({counts['failed']})"),
        ("watch ERROR events (the run is void if any)", counts["watch_errors"]),
        ("requests per DM (audit, lists and watches included)", f"{result['requests_per_dm']:.2f}"),
    ]))
    print("\nRequests by verb and resource (audit):\n")
    print(common.table(["verb", "resource", "requests", "per DM"], common.counter_rows(requests, args.count)))
    common.write_json(result, args.out, "wire-floor.json")
    return 0 if ok and not counts["failed"] and not counts["watch_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
