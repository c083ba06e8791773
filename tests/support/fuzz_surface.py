"""The HTTP surface fuzz shared by the test suite and benchmarks/runtime_fuzz.py: strategies for hostile requests
and the oracle every answer must satisfy.

The oracle (what a caller or an auditor would notice):
- no 5xx except 503 with a non-empty `error` saying why; an unsupported content type is 415; a UTF-16 body is
  never decided;
- bodies come plain, gzip or deflate, and V2 tensors in JSON or in the binary tensor data extension, with outputs
  asked for as JSON or binary (a binary answer is read back with tritonclient, as a caller would);
- every 200 carries schema-valid, self-consistent decisions: a model decision passes the trajectory checks, equals
  the last step's label/argmax and carries its probability; a rules decision is the matching rule's label with
  `source: rules`, a reason and no confidence;
- the audit holds exactly one record per row that left the server (every row of a 200, the rows named by a
  503 for want of a decision) and none for the others, matched by trace id.
"""

from __future__ import annotations

import gzip
import json
import secrets
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import httpx
from arbiter_runtime.config import parse_config
from arbiter_runtime.trajectory import TrajectoryChecker
from hypothesis import strategies as st
from tritonclient.http import InferResult

from support.hostile_upstream import BEHAVIOURS
from support.runtime_helpers import base_config

SLOW_BEHAVIOURS = ("slow", "trickle")
FAST_BEHAVIOURS = tuple(b for b in BEHAVIOURS if b not in SLOW_BEHAVIOURS)
# Hostile behaviours whose answer may still be a usable decision: everything else must never become one.
USABLE = {
    "scored": {"valid", "extra_fields", "slow", "trickle", "flip_generated"},
    "generated": {"valid", "extra_fields", "slow", "trickle", "flip_probabilities", "positive_logprob",
                  "logprobs_null", "entries_not_objects", "logprob_string", "logprob_null", "logprob_bool",
                  "logprob_object", "top_logprob_string", "top_logprob_null", "top_logprobs_dict",
                  "top_logprobs_string", "top_logprobs_ints", "token_missing", "token_int", "bytes_string",
                  "bytes_out_of_range"},
}
FALLBACK_REASONS = {"upstream_down", "upstream_error", "deadline", "invalid", "low_confidence"}


def fuzz_config(upstream_url: str, mode: str = "scored", deadline_ms: int = 300) -> dict[str, Any]:
    """Open enough that deep and odd documents reach the model and the rules; rules that read nested input."""
    return base_config(
        upstream_url, trajectoryMode=mode, deadlineMs=deadline_ms, confidenceThreshold=0.5,
        lowConfidencePolicy="fallback",
        inputSchema={"type": "object", "required": ["amount", "country"],
                     "properties": {"amount": {"type": "number"}, "country": {"type": "string"},
                                    "count": {"type": "integer"}, "extra": {}}},
        fallbackRules=[
            {"name": "large-amount", "when": "input.amount > 10000.0", "decision": "deny",
             "reasoningCode": "debt_high"},
            {"name": "nested", "when": "has(input.extra) && size(input.extra) > 2", "decision": "review",
             "reasoningCode": "thin_file"},
            {"name": "unsure-model", "when": "has(model.decision) && model.confidence < 0.5",
             "decision": "review", "reasoningCode": "thin_file"},
            {"name": "default", "when": "true", "decision": "approve", "reasoningCode": "income_ok"},
        ],
        upstream={"url": upstream_url, "servedModelName": "credit-v1", "maxRetries": 2},
    )


# -- strategies ---------------------------------------------------------------------------------------------------

# Text including lone surrogates (what a "\ud800" escape decodes to) and other code points hypothesis avoids.
clean_texts = st.one_of(st.text(max_size=12), st.sampled_from(["DE", "US", "", "é", "\u0000", "\U0001F600"]))
bad_texts = st.one_of(
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2),
    st.text(st.characters(codec="utf-8"), max_size=6).map(lambda s: s + "\ud800"),
)
# Mostly valid text; one draw in ~8 carries a lone surrogate (what a "\ud800" escape decodes to).
texts = st.integers(0, 7).flatmap(lambda i: bad_texts if i == 7 else clean_texts)
numbers = st.one_of(
    st.integers(min_value=-10**6, max_value=10**6),
    st.integers(min_value=-10**6, max_value=10**6).map(float),  # 1200.0: must decide as 1200
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=0, max_value=400).map(lambda k: 10 ** k),  # hundreds of digits
    st.integers(min_value=0, max_value=400).map(lambda k: -(10 ** k)),
    st.sampled_from([0, -0.0, 1e308, 5e-324, 2 ** 53 + 1, 2.0 ** 53, 1e16]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3),
                           max_leaves=8)
countries = st.one_of(st.sampled_from(["DE", "US", "FR", "PL", "é", "\U0001F600", ""]), texts)
_documents = st.fixed_dictionaries(
    {"amount": numbers, "country": countries},
    optional={"count": st.one_of(st.integers(), numbers),
              "extra": st.one_of(json_values, st.integers(0, 40).map(nested))})
_odd_documents = st.one_of(
    st.fixed_dictionaries({"amount": numbers, "country": texts}, optional={"count": numbers, "extra": json_values}),
    json_values)
# Mostly documents shaped like the input schema (they reach the model and the rules), one in five anything at all.
documents = st.integers(0, 4).flatmap(lambda i: _odd_documents if i == 4 else _documents)


def dumps_doc(doc: Any) -> str:
    # ensure_ascii writes lone surrogates as \ud800 escapes: valid JSON text carrying invalid Unicode
    return json.dumps(doc, ensure_ascii=True)


CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "application/cloudevents+json", None,
                 "text/plain", "application/x-www-form-urlencoded", "application/xml", "multipart/form-data",
                 "application/json; charset=latin-1", "APPLICATION/JSON"]


@dataclass
class Case:
    path: str
    body: bytes
    content_type: str | None
    chunked: bool
    rows: int = 1
    script: list[str] = field(default_factory=lambda: ["valid"])
    headers: dict[str, str] = field(default_factory=dict)  # content coding, binary framing
    framed: bool = False
    utf16: bool = False


def _frame(req: dict[str, Any], tensor: dict[str, Any]) -> tuple[bytes, str]:
    """The request in the binary tensor data extension (as tritonclient sends it): (body, JSON header length)."""
    raw = b"".join(struct.pack("<I", len(b)) + b for b in (d.encode() for d in tensor.pop("data")))
    tensor["parameters"] = {"binary_data_size": len(raw)}
    head = json.dumps(req, ensure_ascii=True).encode()
    return head + raw, str(len(head))


def _code(draw, body: bytes, case_headers: dict[str, str], text: bool) -> tuple[bytes, bool]:
    """Maybe compress the body (gzip, deflate) or, for a JSON text body, send it as UTF-16; (body, is UTF-16)."""
    coding = draw(st.sampled_from([None] * 6 + ["gzip", "deflate", "utf-16"]))
    if coding == "utf-16" and text:
        return body.decode("utf-8").encode("utf-16"), True
    if coding in ("gzip", "deflate"):
        case_headers["content-encoding"] = coding
        return (gzip.compress(body) if coding == "gzip" else zlib.compress(body)), False
    return body, False


@st.composite
def cases(draw, hostile: bool = False) -> Case:
    kind = draw(st.sampled_from(["decisions"] * 4 + ["infer"] * 4 + ["raw"]))
    extra: dict[str, str] = {}
    framed = False
    if kind == "decisions":
        path, rows = "/v1/decisions", 1
        body = dumps_doc(draw(documents)).encode()
    elif kind == "infer":
        docs = draw(st.lists(documents, min_size=1, max_size=4))
        data: Any = [dumps_doc(d) for d in docs]
        tensor: dict[str, Any] = {"name": "input", "shape": [len(data)], "datatype": "BYTES", "data": data}
        if draw(st.integers(0, 9)) == 9:  # a tensor missing some of its fields
            tensor = draw(st.fixed_dictionaries({}, optional={k: st.just(v) for k, v in tensor.items()}))
        req: dict[str, Any] = {"inputs": [tensor]}
        if draw(st.booleans()):
            req["id"] = draw(texts)
        if draw(st.booleans()):
            req["outputs"] = [{"name": n} for n in draw(st.lists(st.sampled_from(
                ["decision", "confidence", "trajectory", "source", "low_confidence", "nope"]), max_size=3))]
        if draw(st.integers(0, 3)) == 0:
            req["parameters"] = {"binary_data_output": True}
        path = draw(st.sampled_from(["/v2/models/credit/infer", "/v2/models/credit/versions/v1/infer"] * 4
                                    + ["/v2/models/other/infer", "/v2/models/credit/versions/v9/infer"]))
        framed = isinstance(tensor.get("data"), list) and draw(st.integers(0, 2)) == 0
        if framed:
            body, extra["inference-header-content-length"] = _frame(req, tensor)
        else:
            body = json.dumps(req, ensure_ascii=True).encode()
        rows = len(docs)
    else:
        path, rows = draw(st.sampled_from(["/v1/decisions", "/v2/models/credit/infer"])), 1
        body = draw(st.one_of(st.binary(max_size=64), st.sampled_from(
            [b"", b"{", b"[" * 5000, b'{"amount": 1e999, "country": "DE"}', b'{"amount": NaN, "country": "DE"}',
             b'\xff\xfe{"amount": 1}', b'{"amount": 1, "country": "\\ud800"}', b"<xml/>", b"amount=1&country=DE",
             b'{"amount": 1' + b"0" * 5000 + b', "country": "DE"}'])))
    body, utf16 = _code(draw, body, extra, text=kind != "raw" and not framed)
    content_type = draw(st.sampled_from(CONTENT_TYPES)) if draw(st.integers(0, 5)) == 0 else "application/json"
    if framed and draw(st.booleans()):
        content_type = draw(st.sampled_from(["application/octet-stream", None]))  # KServe's SDK, tritonclient
    script = ["valid"]
    if hostile:
        # A third of the calls are answered well (so retries can succeed); a few are slower than the deadline.
        pick = st.integers(0, 299).map(lambda i: SLOW_BEHAVIOURS[i % 2] if i < 4 else "valid" if i < 100 else
                                       FAST_BEHAVIOURS[i % len(FAST_BEHAVIOURS)])
        script = draw(st.lists(pick, min_size=1, max_size=3))
    return Case(path, body, content_type, draw(st.booleans()), rows, script, extra, framed, utf16)


def _binary_answer(r: httpx.Response) -> dict[str, Any]:
    """A binary tensor data answer as its JSON form, decoded by tritonclient (a real client, not our encoder)."""
    result = InferResult.from_response_body(r.content, header_length=int(r.headers["inference-header-content-length"]))
    body = result.get_response()
    for out in body["outputs"]:
        if "data" not in out:
            out["data"] = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy(out["name"]).tolist()]
    return body


# -- the oracle ---------------------------------------------------------------------------------------------------

@dataclass
class Tally:
    cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    inconsistent: list[str] = field(default_factory=list)
    audit_mismatches: list[str] = field(default_factory=list)
    decisions: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    rows_delivered: int = 0
    records: int = 0

    def ok(self) -> bool:
        return not (self.server_errors or self.inconsistent or self.audit_mismatches)

    def summary(self) -> str:
        return (f"cases={self.cases} status={dict(sorted(self.by_status.items()))} decisions={self.decisions} "
                f"sources={self.by_source} server_errors={len(self.server_errors)} "
                f"inconsistent={len(self.inconsistent)} audit_mismatches={len(self.audit_mismatches)} "
                f"rows_delivered={self.rows_delivered} audit_records={self.records}")


class Oracle:
    def __init__(self, raw_cfg: dict[str, Any], runtime):
        self.cfg = parse_config(raw_cfg)
        self.checker = TrajectoryChecker(self.cfg)
        self.rules = {r.name: r for r in self.cfg.fallback_rules}
        self.runtime = runtime
        self.tally = Tally()
        self._seen_records = 0

    def _usable(self) -> set[str]:
        """The hostile behaviours whose answer may still be a decision. Where the runtime ends a scored answer on its
        last step (it asks for exactly the answer's tokens: every name one token, or the fused format), a whole
        answer finishes with `length` anyway, so `finish_length` changes nothing about it."""
        usable = USABLE[self.cfg.trajectory_mode]
        mode = getattr(self.runtime.runtime.decider, "mode", None)  # loaded once the server is ready
        return usable | {"finish_length"} if getattr(mode, "exact", None) else usable

    def _decision_problem(self, decision: Any, confidence: Any, source: Any, trajectory: Any, flagged: Any,
                          v2: bool) -> str | None:
        if decision not in self.cfg.labels:
            return f"decision {decision!r} is not a label"
        if source == "model":
            try:
                self.checker.check(trajectory)
            except Exception as exc:
                return f"model trajectory fails the checks: {exc}"
            want, p = self.checker.decide(trajectory)
            if decision != want:
                return f"decision {decision} but the trajectory says {want}"
            if not isinstance(confidence, (int, float)) or abs(confidence - p) > 1e-6:
                return f"confidence {confidence!r} but the trajectory gives {p}"
            if p < self.cfg.confidence_threshold:
                return f"model decision below the threshold ({p}) under lowConfidencePolicy fallback"
            if flagged:
                return "model decision flagged low-confidence above the threshold"
            return None
        if source == "rules":
            if not isinstance(trajectory, dict):
                return "rules trajectory is not an object"
            rule = self.rules.get(trajectory.get("rule"))
            if rule is None or rule.decision != decision or trajectory.get("reasoningCode") != rule.reasoning_code:
                return f"rules decision {decision} does not match rule {trajectory.get('rule')!r}"
            if trajectory.get("fallbackReason") not in FALLBACK_REASONS:
                return f"rules decision without a reason: {trajectory.get('fallbackReason')!r}"
            if (0.0 if v2 else None) != confidence:
                return f"rules decision carries confidence {confidence!r}"
            return None
        return f"unknown source {source!r}"

    def check(self, client: httpx.Client, case: Case, hostile=None) -> None:
        t = self.tally
        t.cases += 1
        if hostile is not None:
            hostile.set_script(case.script)
        trace = secrets.token_hex(16)
        headers = {"traceparent": f"00-{trace}-{secrets.token_hex(8)}-01", **case.headers}
        if case.content_type is not None:
            headers["content-type"] = case.content_type
        content: Any = case.body
        if case.chunked:
            body = case.body
            content = iter([body[i:i + 7] for i in range(0, len(body), 7)] or [b""])
        where = (f"{case.path} ct={case.content_type} headers={case.headers} chunked={case.chunked} "
                 f"script={case.script} body={case.body[:300]!r}")
        try:
            r = client.post(case.path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            t.server_errors.append(f"transport error {type(exc).__name__}: {exc} | {where}")
            return
        t.by_status[r.status_code] = t.by_status.get(r.status_code, 0) + 1
        try:
            body = _binary_answer(r) if "inference-header-content-length" in r.headers else r.json()
        except Exception:
            t.server_errors.append(f"{r.status_code} with a body that is not JSON: {r.text[:200]!r} | {where}")
            return
        delivered = 0
        answered: list[str] = []
        if r.status_code >= 500 and not (r.status_code == 503 and isinstance(body.get("error"), str)
                                         and body["error"]):
            t.server_errors.append(f"{r.status_code} {r.text[:300]} | {where}")
        ct = (case.content_type or "application/json").split(";")[0].strip().lower()
        bad_type = ((ct != "application/json" and not ct.endswith("+json")) or "latin-1" in (case.content_type or "")
                    ) and not (case.framed and ct == "application/octet-stream")
        if case.utf16 and r.status_code == 200:
            t.inconsistent.append(f"a UTF-16 body was decided | {where}")
        if bad_type and r.status_code in (200, 400, 413) and case.content_type is not None:
            t.inconsistent.append(f"unsupported content type answered {r.status_code} | {where}")
        if r.status_code == 200:
            problems = []
            if case.path == "/v1/decisions":
                rows = [(body.get("decision"), body.get("confidence"), body.get("source"), body.get("trajectory"),
                         body.get("lowConfidence"), False)]
            else:
                cols = {o["name"]: o["data"] for o in body.get("outputs", [])}
                n = len(next(iter(cols.values()))) if cols else 0
                if n != case.rows:
                    problems.append(f"{n} rows answered for {case.rows}")
                if {"decision", "confidence", "source", "trajectory", "low_confidence"} <= set(cols):
                    rows = [(cols["decision"][i], cols["confidence"][i], cols["source"][i],
                             json.loads(cols["trajectory"][i]), cols["low_confidence"][i], True) for i in range(n)]
                else:
                    rows = []
                    answered = list(cols.get("decision", []))
                delivered = n
            poisoned = hostile is not None and not (set(case.script) & self._usable())
            for decision, confidence, source, trajectory, flagged, v2 in rows:
                if poisoned and source == "model":
                    problems.append(f"a model decision although every upstream answer was unusable: {decision}")
                t.decisions += 1
                t.by_source[source] = t.by_source.get(source, 0) + 1
                answered.append(decision)
                problem = self._decision_problem(decision, confidence, source, trajectory, flagged, v2)
                if problem:
                    problems.append(problem)
            if case.path == "/v1/decisions":
                delivered = 1
            for p in problems:
                t.inconsistent.append(f"{p} | {where}")
        elif r.status_code == 503 and isinstance(body.get("rows"), list):
            delivered = len(body["rows"])
        t.rows_delivered += delivered
        audit = self.runtime.runtime.audit
        if not audit.wait_written(10):
            t.audit_mismatches.append(f"audit writer did not catch up | {where}")
            return
        records = self.runtime.records_since(self._seen_records)
        self._seen_records += len(records)
        t.records += len(records)
        mine = [rec for rec in records if rec.get("traceId") == trace]
        if len(mine) != delivered or len(records) != len(mine):
            t.audit_mismatches.append(f"{len(mine)} audit records for {delivered} rows delivered "
                                      f"({len(records)} new records) | status {r.status_code} | {where}")
        elif (r.status_code == 200 and answered
              and sorted(answered) != sorted(rec["decision"] for rec in mine)):
            t.audit_mismatches.append(f"audit decisions {[rec['decision'] for rec in mine]} differ from the answer "
                                      f"{answered} | {where}")
