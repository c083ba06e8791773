"""One verdict for every signal a pass reads: transient or permanent (pure).

Transient: an outage of something the candidate does not own (KServe's webhooks unreachable, the apiserver or etcd
timing out, a 5xx, a full quota): the promotion holds, names the cause, and goes on by itself once it clears; the
progress deadline bounds the wait. Permanent: the candidate's own failure (crash loop, image pull, KServe's failed
load) or a refusal no retry changes (Pod Security, a webhook that *answered* no, a 4xx): the promotion fails.
The table is in docs/operations.md ("Transient and permanent signals").

Messages are matched on the texts the apiserver and the kubelet write (stable since Kubernetes 1.16); a refusal is
looked for first, so "admission webhook X denied the request" is never read as an outage even when it comes as 500.
"""

from __future__ import annotations

from dataclasses import dataclass

WEBHOOK_UNAVAILABLE = "WebhookUnavailable"  # an admission webhook could not be called (down, timing out)
APISERVER_UNAVAILABLE = "ApiserverUnavailable"  # the apiserver or etcd: 5xx, 429, timeouts, connection refused
QUOTA_EXCEEDED = "QuotaExceeded"  # a ResourceQuota is full: it frees when other pods go, or an admin raises it
TRANSIENT_REASONS = (WEBHOOK_UNAVAILABLE, APISERVER_UNAVAILABLE, QUOTA_EXCEEDED)

# A refusal: someone answered, and the answer is no. Checked before any outage text.
REFUSED_PHRASES = ("denied the request", "denied request", "violates podsecurity",
                   "is forbidden: unable to validate against any", "is invalid", "admission webhook denied")
# The outages, in the order they are looked for: (phrases, reason). docs/operations.md's table lists each phrase
# (tests/unit/operator/promotion/test_signals_doc.py holds the two together).
OUTAGES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("failed calling webhook", "failed to call webhook"), WEBHOOK_UNAVAILABLE),
    (("exceeded quota",), QUOTA_EXCEEDED),
    (("context deadline exceeded", "connection refused", "i/o timeout", "timeout awaiting",
      "internal error occurred", "the server is currently unable", "etcdserver", "too many requests",
      "service unavailable", "connection reset", "tls handshake timeout", "server has asked for the client"),
     APISERVER_UNAVAILABLE),
)


def _refused(low: str) -> bool:
    return any(p in low for p in REFUSED_PHRASES)


@dataclass(frozen=True)
class Verdict:
    reason: str  # CamelCase, for the condition
    transient: bool  # True: hold (up to the deadline); False: the version failed, or the write was refused


def classify_message(message: str, permanent_reason: str) -> Verdict:
    """The verdict on one failure message; `permanent_reason` names it when it is not an outage."""
    low = message.lower()
    if not _refused(low):
        for phrases, reason in OUTAGES:
            if any(p in low for p in phrases):
                return Verdict(reason, True)
    return Verdict(permanent_reason, False)


def classify_status(code: int | None, message: str, refused_reason: str) -> Verdict:
    """The verdict on a failed request: no answer, 408, 429 and 5xx are transient unless the message is a refusal
    (a webhook that denied the request may say so with a 500); any other 4xx is a refusal."""
    by_text = classify_message(message, refused_reason)
    if by_text.transient or _refused(message.lower()):
        return by_text
    if code is None or code in (408, 429) or code >= 500:
        return Verdict(APISERVER_UNAVAILABLE, True)
    return Verdict(refused_reason, False)
