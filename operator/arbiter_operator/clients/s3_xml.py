"""S3's XML answers (a ListObjectsV2 page, an error document), read without trusting the server.

defusedxml's parser refuses a DTD, entity declarations and external references, so an entity bomb is refused before
anything expands. No element tree is built: a small parser target keeps only the few fields we read, refuses nesting
deeper than S3 ever sends and any field longer than S3 allows, so memory stays bounded by what is kept, not by what
was sent. The caller bounds the body itself (clients/s3.py reads at most a page's worth). Anything that is not the
expected document raises `MalformedAnswer`, whose message names what was wrong and never quotes the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote_plus
from xml.etree.ElementTree import ParseError

from defusedxml import DefusedXmlException, DTDForbidden
from defusedxml.ElementTree import DefusedXMLParser

MAX_DEPTH = 8  # ListBucketResult/Contents/Owner/ID is 4 deep
MAX_FIELD_CHARS = 8192  # a key is at most 1,024 bytes, URL-encoded at most 3x that
MAX_SIZE = 1 << 50  # larger than any object S3 stores (5 TiB)


class MalformedAnswer(ValueError):
    """The answer is not the S3 document it should be (not XML, a DTD, too deep, a field too long, a bad number)."""


@dataclass(frozen=True)
class ListedObject:
    key: str  # the full key, URL-decoded when the page says it was URL-encoded
    size: int
    etag: str


@dataclass(frozen=True)
class ListingPage:
    objects: list[ListedObject]
    truncated: bool
    next_token: str | None


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]  # S3 puts its elements in the 2006-03-01 namespace; compatibles may not


@dataclass
class _Fields:
    """Parser target: the text of the elements at `wanted` paths (tuples of local names below the root)."""

    root: str
    wanted: frozenset[tuple[str, ...]]
    repeated: str | None = None  # the element that starts a new record (Contents), or None
    max_records: int = 0
    path: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    top: dict[str, str] = field(default_factory=dict)
    records: list[dict[str, str]] = field(default_factory=list)

    def start(self, tag: str, attrib: object) -> None:
        name = _local(tag)
        if not self.path and name != self.root:
            raise MalformedAnswer(f"the document is <{name[:40]}>, not <{self.root}>")
        self.path.append(name)
        if len(self.path) > MAX_DEPTH:
            raise MalformedAnswer(f"elements nested deeper than {MAX_DEPTH}")
        if self.repeated and len(self.path) == 2 and name == self.repeated:
            if len(self.records) >= self.max_records:
                raise MalformedAnswer(f"more than {self.max_records} objects on one page")
            self.records.append({})
        self.text = []

    def data(self, text: str) -> None:
        if tuple(self.path[1:]) in self.wanted:
            self.text.append(text)
            if sum(map(len, self.text)) > MAX_FIELD_CHARS:
                raise MalformedAnswer(f"<{self.path[-1][:40]}> longer than {MAX_FIELD_CHARS} characters")

    def end(self, tag: str) -> None:
        where = tuple(self.path[1:])
        if where in self.wanted:
            value = "".join(self.text)
            if self.repeated and len(where) == 2 and where[0] == self.repeated:
                self.records[-1][where[1]] = value
            else:
                self.top[where[-1]] = value
        self.text = []
        self.path.pop()

    def close(self) -> None:
        return None


def _parse(body: bytes, target: _Fields) -> _Fields:
    parser = DefusedXMLParser(target=target, forbid_dtd=True)
    try:
        parser.feed(body)
        parser.close()
    except MalformedAnswer:
        raise
    except DTDForbidden:
        raise MalformedAnswer("the document declares a DTD, which S3 never sends") from None
    except DefusedXmlException:
        raise MalformedAnswer("the document declares entities, which S3 never sends") from None
    except (ParseError, UnicodeError, ValueError) as exc:
        raise MalformedAnswer(f"not well-formed XML ({str(exc)[:80]})") from None
    return target


def parse_listing(body: bytes, max_keys: int) -> ListingPage:
    """One ListObjectsV2 page (`<ListBucketResult>`); at most `max_keys` objects, as the request asked."""
    contents = ("Key", "Size", "ETag")
    fields = _parse(body, _Fields(
        root="ListBucketResult",
        wanted=frozenset({("IsTruncated",), ("NextContinuationToken",), ("EncodingType",)}
                         | {("Contents", name) for name in contents}),
        repeated="Contents", max_records=max_keys,
    ))
    url_encoded = fields.top.get("EncodingType", "").strip().lower() == "url"
    objects = []
    for record in fields.records:
        if "Key" not in record:
            raise MalformedAnswer("an object without a <Key>")
        size_text = record.get("Size", "0").strip()
        if not size_text.isdigit() or int(size_text) > MAX_SIZE:  # isdigit: no sign, no spaces, no underscores
            raise MalformedAnswer("an object <Size> that is not a byte count")
        key = unquote_plus(record["Key"]) if url_encoded else record["Key"]  # S3 writes a space as "+"
        objects.append(ListedObject(key=key, size=int(size_text), etag=record.get("ETag", "").strip().strip('"')))
    truncated_text = fields.top.get("IsTruncated", "false").strip().lower()
    if truncated_text not in ("true", "false"):
        raise MalformedAnswer("<IsTruncated> is neither true nor false")
    token = fields.top.get("NextContinuationToken") or None
    return ListingPage(objects=objects, truncated=truncated_text == "true", next_token=token)


@dataclass(frozen=True)
class ObjectLock:
    """A bucket's object-lock configuration: enabled, and its default retention (mode, days) if it has one."""

    enabled: bool
    mode: str | None = None
    days: int | None = None  # a default in years counts 365 days each


def parse_versioning(body: bytes) -> str:
    """The `<Status>` of a `<VersioningConfiguration>`: Enabled, Suspended, or "" (never enabled)."""
    fields = _parse(body, _Fields(root="VersioningConfiguration", wanted=frozenset({("Status",)})))
    status = fields.top.get("Status", "").strip()
    if status not in ("", "Enabled", "Suspended"):
        raise MalformedAnswer("<Status> is neither Enabled nor Suspended")
    return status


def parse_object_lock(body: bytes) -> ObjectLock:
    """An `<ObjectLockConfiguration>`: whether object lock is enabled, and the default retention rule."""
    rule = ("Rule", "DefaultRetention")
    fields = _parse(body, _Fields(root="ObjectLockConfiguration", wanted=frozenset(
        {("ObjectLockEnabled",), (*rule, "Mode"), (*rule, "Days"), (*rule, "Years")})))
    mode = fields.top.get("Mode", "").strip() or None
    if mode not in (None, "GOVERNANCE", "COMPLIANCE"):
        raise MalformedAnswer("<Mode> is neither GOVERNANCE nor COMPLIANCE")
    days = None
    for name, scale in (("Days", 1), ("Years", 365)):
        text = fields.top.get(name, "").strip()
        if text:
            if not text.isdigit() or len(text) > 6:
                raise MalformedAnswer(f"<{name}> is not a count")
            days = int(text) * scale
    return ObjectLock(enabled=fields.top.get("ObjectLockEnabled", "").strip() == "Enabled", mode=mode, days=days)


def parse_error_code(body: bytes) -> str | None:
    """The `<Code>` of an S3 `<Error>` document, when it is one and the code looks like one (letters, digits, dots)."""
    try:
        fields = _parse(body, _Fields(root="Error", wanted=frozenset({("Code",)})))
    except MalformedAnswer:
        return None
    code = fields.top.get("Code", "").strip()
    if not code or len(code) > 64 or not all(c.isascii() and (c.isalnum() or c in "._-") for c in code):
        return None
    return code
