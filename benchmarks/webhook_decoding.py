"""The admission webhook's decoding, kopf's server beside the operator's: each server's request handler on a loopback
aiohttp server, in front of the same instant dispatch (it admits whatever reaches it), fed AdmissionReviews whose
object nests 100, 1,000 and 3,000 levels deep (the apiserver admits up to 10,000), one that lacks request.uid, and
one of 2 MiB. Prints each server's status and time per review: kopf's answers 500 where the standard `json` runs out
of recursion, the operator's answers every review (a refusal naming the depth limit, or a 400 naming what is missing).

    .venv/bin/python benchmarks/webhook_decoding.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import kopf
from arbiter_operator import admission


async def admit(doc: dict[str, Any], **_: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": doc["request"]["uid"], "allowed": True}}


def review(obj: Any, uid: bool = True) -> dict[str, Any]:
    request = {"operation": "CREATE", "userInfo": {"username": "dev"}, "object": obj,
               "resource": {"group": "arbiter.dev", "version": "v1alpha1", "resource": "decisionmodels"}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", **request} if uid else request}


def nested(levels: int) -> bytes:
    return json.dumps(review("@@")).replace('"@@"', '{"a":' * levels + "1" + "}" * levels).encode()


CASES = {**{f"object nested {n:,} deep": nested(n) for n in (100, 1_000, 3_000)},
         "no request.uid": json.dumps(review({"metadata": {"name": "x"}}, uid=False)).encode(),
         "a 2 MiB review": json.dumps(review({"metadata": {"name": "x"}, "pad": "x" * (2 << 20)})).encode()}


async def measure(serve: Any) -> dict[str, tuple[int, float]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await serve(admit, request)

    app = web.Application()
    app.router.add_post("/{id:.*}", handle)
    out = {}
    async with TestClient(TestServer(app)) as http:
        for name, data in CASES.items():
            started = time.perf_counter()
            resp = await http.post("/decisionmodels", data=data)
            await resp.read()
            out[name] = (resp.status, (time.perf_counter() - started) * 1000)
    return out


def main() -> int:
    import logging

    logging.disable(logging.CRITICAL)  # aiohttp logs each 500's traceback
    kopf_, ours = asyncio.run(measure(kopf.WebhookServer._serve)), asyncio.run(
        measure(admission.BoundedWebhookServer._serve))
    print(common.table(["review", "kopf.WebhookServer", "BoundedWebhookServer"], [
        (name, f"{kopf_[name][0]} in {kopf_[name][1]:.1f} ms", f"{ours[name][0]} in {ours[name][1]:.1f} ms")
        for name in CASES]))
    return 0 if all(status < 500 for status, _ in ours.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
