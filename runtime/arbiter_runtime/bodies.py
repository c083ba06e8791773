"""What a request body's bytes mean: its content coding (gzip, deflate, identity) and its text encoding (UTF-8 only).

Content codings are decoded as the body streams in, with the decoded size bounded by the same limit as a plain body:
a small compressed body that inflates past it (a decompression bomb) is refused with 413 once the limit is passed,
holding at most the limit in memory. zlib's `decompressobj` with `max_length` does the bounding; no other library is
needed.

Only UTF-8 is JSON here (RFC 8259 section 8.1), with or without a UTF-8 byte order mark. The standard library's
`json.loads` would also read UTF-16 and UTF-32 bytes; a gateway that inspects the body as UTF-8 would then see
NUL-padded text that this server decides, so those encodings get a 400 that names them.
"""

from __future__ import annotations

import json
import zlib

from .protocol import BadRequest

UTF8_BOM = b"\xef\xbb\xbf"
# RFC 9110 section 8.4.1: x-gzip is an alias of gzip.
CODINGS = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
STEP = 1 << 16


class UnsupportedMediaType(ValueError):
    """415 with this message."""


class BodyTooLarge(ValueError):
    """413 with this message."""


def content_coding(header: str | None) -> str | None:
    """The one coding to undo (gzip or deflate), None for identity; UnsupportedMediaType names any other."""
    if header is None:
        return None
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    unknown = [c for c in codings if c not in CODINGS]
    if unknown:
        raise UnsupportedMediaType(f"content coding {unknown[0][:40]!r} is not supported; send the body "
                                   "uncompressed, gzip or deflate")
    if len(codings) > 1:
        raise UnsupportedMediaType(f"content codings {', '.join(codings)[:80]} are stacked; send one of gzip or "
                                   "deflate")
    return CODINGS[codings[0]] if codings else None


class Decoder:
    """Undoes one content coding chunk by chunk; BodyTooLarge once the decoded body passes `limit` bytes."""

    def __init__(self, coding: str, limit: int):
        self.coding = coding
        self.limit = limit
        self.size = 0
        self._z: zlib._Decompress | None = None
        self._head = b""  # deflate: the first bytes, until it is known whether a zlib header comes first

    def _start(self, data: bytes) -> None:
        if self.coding == "gzip":
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            return
        # "deflate" is the zlib format (RFC 9110 section 8.4.1.2), but some clients send the raw deflate stream:
        # a zlib header is two bytes, method 8, whose big-endian value is a multiple of 31.
        zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
        self._z = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)

    def feed(self, chunk: bytes) -> bytes:
        if self._z is None:
            self._head += chunk
            if len(self._head) < 2:
                return b""
            chunk, self._head = self._head, b""
            self._start(chunk)
        out: list[bytes] = []
        while True:
            assert self._z is not None
            if self._z.eof:  # gzip: a further member (RFC 1952 allows several); deflate: bytes after the end
                if not chunk:
                    break
                if self.coding != "gzip":
                    raise BadRequest("the deflate body has data after the end of its compressed stream")
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            step = min(self.limit - self.size + 1, STEP)
            try:
                # At most STEP bytes a call: a small chunk of a bomb never becomes one large buffer.
                piece = self._z.decompress(chunk, step)
            except zlib.error as exc:
                raise BadRequest(f"the body is not valid {self.coding} data ({exc})") from None
            self.size += len(piece)
            if self.size > self.limit:
                raise BodyTooLarge(f"request body larger than {self.limit} bytes once decoded ({self.coding})")
            out.append(piece)
            chunk = self._z.unused_data if self._z.eof else self._z.unconsumed_tail
            # A full step may leave output inside zlib with no input left: ask again until a step comes back short.
            if not chunk and (self._z.eof or len(piece) < step):
                break
        return b"".join(out)

    def finish(self) -> bytes:
        """The end of the body: the compressed stream must be complete."""
        if self._z is None:
            if not self._head:
                return b""
            raise BadRequest(f"the {self.coding} body is truncated")
        if not self._z.eof:
            raise BadRequest(f"the {self.coding} body is truncated (its compressed stream does not end)")
        return b""


def json_text(data: bytes, what: str = "request body") -> str:
    """`data` as text if it is UTF-8 (a UTF-8 byte order mark is dropped); BadRequest naming the encoding if not."""
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    elif b"\x00" in data[:4] or data[:1] in (b"\xfe", b"\xff"):
        # RFC 4627 section 3: the byte order mark or the pattern of NULs in the first four bytes says UTF-16/32
        # (looked at only when one of them is there: most bodies are plain UTF-8, and this runs per BYTES element).
        encoding = json.detect_encoding(data)
        if encoding != "utf-8":
            raise BadRequest(f"{what} is {encoding.upper()}, not UTF-8; send JSON as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"{what} is not UTF-8 (invalid byte at offset {exc.start}); send JSON as UTF-8") from None
