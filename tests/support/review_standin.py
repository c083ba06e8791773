"""The apiserver's TokenReview and SubjectAccessReview endpoints as the operator's metrics filter (kube/authn.py)
meets them, played in memory: the transport a `Reviewer` is given, answering each review from a script (an answer,
a function of the review, or an exception the transport raises), optionally held until a gate opens. A test peer: it
never ships."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from arbiter_operator.kube import authn

TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bW9uOnByb20ifQ.c2lnbmF0dXJl"
USER = {"username": "system:serviceaccount:mon:prometheus", "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:mon", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]}}

Answer = tuple[int, bytes] | BaseException


def review(status: dict[str, Any], code: int = 201) -> tuple[int, bytes]:
    return code, orjson.dumps({"apiVersion": "v1", "kind": "Review", "status": status})


ALLOWED = {authn.TOKENREVIEWS: review({"authenticated": True, "user": USER}),
           authn.SUBJECTACCESSREVIEWS: review({"allowed": True})}


class Apiserver:
    """The transport the Reviewer uses, answering from `answers` by path (a callable: called with the body)."""

    def __init__(self, answers: dict[str, Answer | Callable[[dict[str, Any]], Answer]] | None = None,
                 gate: asyncio.Event | None = None) -> None:
        self.answers = dict(ALLOWED if answers is None else answers)
        self.gate = gate
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, body: bytes, query: list[tuple[str, str]], content_type: str,
                      timeout: float) -> tuple[int, str, bytes]:
        assert (method, query, content_type) == ("POST", [], "application/json")
        doc = orjson.loads(body)
        self.sent.append((path, doc))
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers[path]
        if callable(answer) and not isinstance(answer, BaseException):
            answer = answer(doc)
        if isinstance(answer, BaseException):
            raise answer
        return answer[0], "", answer[1]


