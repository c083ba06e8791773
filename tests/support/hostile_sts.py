"""A hostile STS endpoint: answers AssumeRoleWithWebIdentity (the query API's form POST) with what `answer` returns,
on raw asyncio streams (support.loopback_peer), so it can refuse, fail, stall or send what is not STS's XML. It
records each call's parameters (the web identity token, the role). A test peer: it never ships."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from support.hostile_s3 import Answer
from support.loopback_peer import LoopbackPeer

STS_NS = "https://sts.amazonaws.com/doc/2011-06-15/"


@dataclass(frozen=True)
class Issued:
    """Temporary credentials the peer handed out."""

    access_key: str
    secret_key: str
    session_token: str
    expires: dt.datetime


def issue(lifetime: dt.timedelta = dt.timedelta(hours=1)) -> Issued:
    return Issued("ASIA" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30), secrets.token_urlsafe(60),
                  dt.datetime.now(dt.UTC) + lifetime)


def credentials_xml(issued: Issued) -> bytes:
    expires = issued.expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f'<AssumeRoleWithWebIdentityResponse xmlns="{STS_NS}"><AssumeRoleWithWebIdentityResult>'
            f"<Credentials><AccessKeyId>{issued.access_key}</AccessKeyId>"
            f"<SecretAccessKey>{issued.secret_key}</SecretAccessKey><SessionToken>{issued.session_token}"
            f"</SessionToken><Expiration>{expires}</Expiration></Credentials>"
            "<SubjectFromWebIdentityToken>system:serviceaccount:arbiter:arbiter</SubjectFromWebIdentityToken>"
            "<AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/models-reader/s</Arn>"
            "<AssumedRoleId>AROA:s</AssumedRoleId></AssumedRoleUser></AssumeRoleWithWebIdentityResult>"
            "<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>"
            ).encode()


def sts_error_xml(code: str, message: str = "refused") -> bytes:
    return (f'<ErrorResponse xmlns="{STS_NS}"><Error><Type>Sender</Type><Code>{code}</Code>'
            f"<Message>{message}</Message></Error><RequestId>1</RequestId></ErrorResponse>").encode()


def granted(issued: Issued) -> Answer:
    return Answer(200, credentials_xml(issued), headers=[("Content-Type", "text/xml")])


class HostileSTS(LoopbackPeer):
    name = "hostile-sts"

    def __init__(self) -> None:
        super().__init__()
        self.answer: Callable[[dict[str, str]], Answer] = lambda call: granted(issue())
        self.calls: list[dict[str, str]] = []  # each request's form parameters

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self, answer: Callable[[dict[str, str]], Answer]) -> None:
        self.answer, self.calls = answer, []

    async def _exchange(self, reader, writer) -> bool:  # type: ignore[no-untyped-def]
        import asyncio

        _method, _target, _headers, body = await self._read_request(reader)
        call = dict(parse_qsl(body.decode("latin-1"), keep_blank_values=True))
        self.calls.append(call)
        answer = self.answer(call)
        if answer.stall:  # silence before anything: an STS that does not answer
            await asyncio.sleep(answer.stall)
        real = len(answer.body)
        head = [f"HTTP/1.1 {answer.status} Hostile", *(f"{k}: {v}" for k, v in answer.headers),
                f"Content-Length: {real if answer.content_length is None else answer.content_length}", "", ""]
        writer.write("\r\n".join(head).encode("latin-1"))
        writer.write(answer.body)
        await writer.drain()
        return not answer.close
