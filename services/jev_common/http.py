"""aiohttp plumbing shared by the services: error middleware, request ids, API keys, bounded bodies
(JSON, multipart, compressed), JSON answers to malformed HTTP, app runner."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web, web_protocol, web_server
from aiohttp.typedefs import Handler, Middleware
from pydantic import BaseModel, ValidationError

from .errors import (
    HTTP_ERROR_TYPES,
    ApiError,
    ApiKeyInvalid,
    ApiKeyMissing,
    BodyTooLarge,
    DomainError,
    DuplicateKey,
    InvalidRequest,
    MalformedBody,
    UndecodableBody,
    UnsupportedEncoding,
    UnsupportedMediaType,
    api_error_response,
    error_body,
    error_response,
    validation_error,
)
from .gc_pauses import freeze_heap
from .identity import CallerIdentity
from .internal_auth import TRUSTED, matches
from .schema import summarize_details

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger("jev.http")

REQUEST_ID_HEADER = "x-typesafe-request-id"
# How a request is carried (not what it asks: that is the body's): the caller's deadline, and who the caller is
DEADLINE_HEADER = "x-jev-deadline-s"  # seconds this caller waits for the answer (the caller owns the deadline)
CLIENT_HEADER = "x-jev-client"  # the fairness key, set by the frontend (the key's HMAC identity or the address)
PRIORITY_HEADER = "x-jev-priority"  # `bulk` lowers the caller's own priority (jev batch); `interactive` is the default
PRIORITIES = ("interactive", "bulk")
WORKER_HEADER = "x-jev-worker"  # which worker answered a decision (its JEV_WORKER_ID)
REVISION_HEADER = "x-jev-revision"  # the checkpoint that answered it (its pinned revision or content digest)
CODE_VERSION_HEADER = "x-jev-code-version"  # the code that answered it (jev_common.version)
DEVICE_SECONDS_HEADER = "x-jev-device-seconds"  # benchmark mode: the simulated device's seconds for a decision
SDK_HEADER = "x-typesafe-sdk"  # typesafe-sdk sends it on every attempt
RETRY_COUNT_HEADER = "x-typesafe-retry-count"  # ... and this on its retries
RETRY_HEADERS = (SDK_HEADER, RETRY_COUNT_HEADER)
MAX_DEADLINE_S = 600.0
MULTIPART_REQUEST_PART = "request"
MAX_MULTIPART_PARTS = 16
REQUEST_ID = web.RequestKey("request_id", str)
DECODED_ENCODINGS = ("gzip", "deflate", "zstd")  # aiohttp decodes these as the body is read


def validation_details(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic errors in FastAPI's shape; the offending input is left out (it may be huge)."""
    out = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False)[:20]:
        loc = [p if isinstance(p, (str, int)) else str(p) for p in err.get("loc", ())]
        out.append(
            {"loc": ["body", *loc], "msg": str(err.get("msg", "invalid")), "type": str(err.get("type", "value_error"))}
        )
    return out or [{"loc": ["body"], "msg": "invalid request", "type": "value_error"}]


def new_request_id() -> str:
    return "req_" + os.urandom(16).hex()  # as random as uuid4's 122 bits, without building a UUID


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer carries x-typesafe-request-id (the caller's, when a trusted proxy sent one)."""
    rid = request.headers.get(REQUEST_ID_HEADER) or new_request_id()
    request[REQUEST_ID] = rid
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers[REQUEST_ID_HEADER] = rid
        raise
    response.headers[REQUEST_ID_HEADER] = rid
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves in the API's error shape; never a stack trace."""
    try:
        return await handler(request)
    except (DomainError, ApiError) as exc:
        return api_error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = HTTP_ERROR_TYPES.get(exc.status, "http_error")
        message = exc.reason if exc.status != 404 else f"no route {request.method} {request.path}"
        kept = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return error_response(exc.status, type_, message, kept)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - last line of defence: log it, answer the envelope
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal error; see the service log")


def auth_middleware(keys: tuple[str, ...], protected_prefix: str = "/v1/") -> Middleware:
    """`Authorization: Bearer <key>` on /v1/ routes when keys are configured; off (header ignored) otherwise."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if keys and request.path.startswith(protected_prefix):
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not given.strip():
                raise ApiKeyMissing("an API key is required: send Authorization: Bearer <key>")
            if not matches(given.strip(), keys):  # every key compared, in constant time
                raise ApiKeyInvalid("the API key is not valid")
        return await handler(request)

    return middleware


# ----- how a request is carried ------------------------------------------------------------------
def request_deadline(headers: Mapping[str, str], limit_s: float = MAX_DEADLINE_S) -> float | None:
    """The caller's deadline in seconds (`x-jev-deadline-s`), or None when it sent none; a value that is not a
    positive number up to `limit_s` is refused (422), never silently replaced."""
    raw = headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        value = float("nan")
    if not 0 < value <= limit_s:  # also false for nan
        raise InvalidRequest(
            f"header {DEADLINE_HEADER} must be a number of seconds in (0, {limit_s:g}], got {raw[:50]!r}",
            ("headers", DEADLINE_HEADER),
        )
    return value


def request_priority(headers: Mapping[str, str]) -> str:
    """The caller's priority (`x-jev-priority`): `interactive` (also when absent) or `bulk`. Any caller may mark its
    own work bulk, which only lowers its priority; any other value is refused (422), never read as a default."""
    raw = headers.get(PRIORITY_HEADER)
    if raw is None:
        return "interactive"
    value = raw.strip().lower()
    if value not in PRIORITIES:
        raise InvalidRequest(
            f"header {PRIORITY_HEADER} must be one of {', '.join(PRIORITIES)}, got {raw[:50]!r}",
            ("headers", PRIORITY_HEADER),
        )
    return value


def client_key(request: web.Request, identity: CallerIdentity) -> str:
    """Who is asking, for fairness: the frontend's `x-jev-client` when the caller carries the internal credential
    (internal_auth.TRUSTED), else the caller's own identity (a direct caller cannot pick its own fairness key)."""
    given = request.headers.get(CLIENT_HEADER, "").strip() if request.get(TRUSTED, False) else ""
    return given[:128] if given else identity.of(request)


def caller_retries(headers: Mapping[str, str]) -> bool:
    """Whether the caller retries a request it gave up on (typesafe-sdk's headers say so)."""
    return any(name in headers for name in RETRY_HEADERS)


# ----- bodies -----------------------------------------------------------------------------------
def stream_body(request: web.Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The request body as it arrives, in chunks (decompressed when it came with Content-Encoding
    gzip/deflate/zstd), for a route that passes it on without holding it whole. What can be judged before a byte
    is read is judged now (an unsupported encoding 415, a declared length past the cap 413); past `max_bytes` of
    what the body expands to, the iteration raises BodyTooLarge, and a broken compressed stream UndecodableBody."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding == "identity":
        encoding = ""
    if encoding and encoding not in DECODED_ENCODINGS:
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported; "
            f"send {', '.join(DECODED_ENCODINGS)} or an uncompressed body"
        )
    if not encoding and request.content_length is not None and request.content_length > max_bytes:
        raise BodyTooLarge(f"body is {request.content_length} bytes; the limit is {max_bytes}")
    return _chunks(request, max_bytes, encoding)


async def _chunks(request: web.Request, max_bytes: int, encoding: str) -> AsyncIterator[bytes]:
    """The body's chunks, decoded here (aiohttp's own decoding is off, JsonErrorRequestHandler: a compressed stream
    that ended early left it waiting for the rest, and the request hung). Both what arrives and what it expands to
    are held to `max_bytes`."""
    decoder = BodyDecoder(encoding) if encoding else None
    seen = received = 0
    try:
        async for raw in request.content.iter_chunked(1 << 16):
            received += len(raw)
            if received > max_bytes:
                raise BodyTooLarge(f"body exceeds the limit of {max_bytes} bytes")
            chunk = decoder.feed(raw, max_bytes - seen) if decoder else raw
            seen += len(chunk)
            if seen > max_bytes:
                raise BodyTooLarge(f"body exceeds the limit of {max_bytes} bytes once decoded")
            if chunk:
                yield chunk
        if decoder:
            decoder.finish()
    except DomainError:
        raise
    except ConnectionResetError:  # the caller left before its body arrived: nobody to answer, as if cancelled
        raise asyncio.CancelledError from None
    except Exception as exc:  # noqa: BLE001 - a broken compressed stream is the client's fault
        if encoding:
            raise UndecodableBody(f"body could not be decoded as {encoding}: {exc}") from None
        raise


class BodyDecoder:
    """One body's Content-Encoding (gzip, deflate with or without its zlib header, zstd; concatenated members too)
    undone as it streams in; `finish()` refuses a stream that ended before its compressed data did."""

    def __init__(self, encoding: str):
        self.encoding = encoding
        self.member: Any = None  # the current member's decompressor, made on its first byte
        self.started = False

    def _new_member(self, first: bytes) -> Any:
        if self.encoding == "zstd":
            from backports.zstd import ZstdDecompressor

            return ZstdDecompressor()
        if self.encoding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # deflate: a zlib stream, or a raw one (what some clients send): a zlib header's method nibble is 8
        return zlib.decompressobj(zlib.MAX_WBITS if first[0] & 0x0F == 8 else -zlib.MAX_WBITS)

    def feed(self, data: bytes, room: int) -> bytes:
        """What `data` decodes to; past `room` bytes of output it stops (the caller refuses the body then)."""
        out = bytearray()
        while data:
            if self.member is None:
                self.member, self.started = self._new_member(data), True
            out += self.member.decompress(data, max(1, room - len(out) + 1))
            if len(out) > room:
                return bytes(out)
            if not self.member.eof:
                return bytes(out)  # all of `data` taken in (the output was not cut short: it fits in room)
            data, self.member = self.member.unused_data, None  # the next member, if any
        return bytes(out)

    def finish(self) -> None:
        if not self.started:
            raise UndecodableBody(f"an empty body is not {self.encoding} data")
        if self.member is not None:
            raise UndecodableBody(f"body ends before its {self.encoding} stream does")


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The request body (decompressed when it came with Content-Encoding gzip/deflate/zstd), refused
    with 413 past max_bytes: the cap applies to what the body expands to."""
    body = bytearray()
    async for chunk in stream_body(request, max_bytes):
        body += chunk
    return bytes(body)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """object_pairs_hook: a key given twice in one object is refused (json.loads would keep the last, so a
    question id or option name given twice would silently lose the first)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(
                    f"duplicate key {key[:200]!r} in a JSON object: a question id, option name or "
                    "field may appear only once",
                    (key[:200],),
                    kind="duplicate_key",
                )
            seen.add(key)
    return out


LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(value: object) -> bool:
    """Whether any string (keys included) of a decoded JSON value holds a UTF-16 surrogate that no pair made a
    character of (`"\\ud800"` alone): valid JSON text, but no Unicode, which nothing after the parser can encode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def decode_json(raw: bytes) -> object:
    """JSON of any shape; malformed, undecodable, too deep or absurd numbers are a 422 like FastAPI's, and so
    is an object that names a key twice (DuplicateKey) and a string with a lone surrogate escape."""
    try:
        value = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
        if LONE_SURROGATE_ESCAPE.search(raw) and _lone_surrogate(value):
            raise validation_error(
                "JSON string holds a lone UTF-16 surrogate (\\ud800-\\udfff): no character", (0,), "string_unicode"
            )
        return value
    except json.JSONDecodeError as exc:
        raise validation_error(f"JSON decode error: {exc.msg}", (exc.pos,), "json_invalid") from None
    except UnicodeDecodeError:
        raise validation_error("body is not UTF-8 JSON", (0,), "json_invalid") from None
    except RecursionError:
        raise validation_error("JSON is nested too deeply", (0,), "json_invalid") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise validation_error(f"JSON decode error: {exc}", (0,), "json_invalid") from None


async def read_json(request: web.Request, max_bytes: int) -> object:
    return decode_json(await read_body(request, max_bytes))


def parse_model(model: type[M], payload: object) -> M:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        details = validation_details(exc)
        raise InvalidRequest(summarize_details(details), details=details) from None
    except RecursionError:
        raise validation_error("request is nested too deeply") from None


async def read_model(request: web.Request, model: type[M], max_bytes: int) -> M:
    return parse_model(model, await read_json(request, max_bytes))


@dataclass
class SystemOneBody:
    """A /v1/systemone body: the JSON payload, and the raw parts of a multipart request by name."""

    payload: object
    parts: dict[str, bytes] = field(default_factory=dict)
    raw: bytes = b""
    content_type: str = "application/json"


def is_json_type(content_type: str) -> bool:
    """application/json, text/json or any +json type (parameters such as charset ignored)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("application/json", "text/json") or media.endswith("+json")


def check_body_type(content_type: str | None) -> None:
    """The body types /v1/systemone reads: JSON (also when no Content-Type is sent) or multipart/form-data;
    anything else is refused (415) before the body is read."""
    if not content_type or is_json_type(content_type) or content_type.lower().startswith("multipart/form-data"):
        return
    raise UnsupportedMediaType(
        f"Content-Type {content_type.split(';', 1)[0].strip()[:100]!r} is not read here: send "
        "application/json, or multipart/form-data with the JSON in a part named 'request'"
    )


async def read_systemone_body(request: web.Request, max_bytes: int) -> SystemOneBody:
    """JSON, or multipart/form-data whose part `request` is the JSON and the others are raw assets."""
    check_body_type(request.headers.get("Content-Type"))
    raw = await read_body(request, max_bytes)
    content_type = request.headers.get("Content-Type", "application/json")
    if not content_type.lower().startswith("multipart/"):
        return SystemOneBody(decode_json(raw), raw=raw, content_type="application/json")
    parts = parse_multipart(raw, content_type)
    if MULTIPART_REQUEST_PART not in parts:
        raise validation_error(
            f"a multipart request needs a part named {MULTIPART_REQUEST_PART!r} holding the JSON",
            (MULTIPART_REQUEST_PART,),
            "missing",
        )
    payload = decode_json(parts.pop(MULTIPART_REQUEST_PART))
    return SystemOneBody(payload, parts=parts, raw=raw, content_type=content_type)


def parse_multipart(raw: bytes, content_type: str) -> dict[str, bytes]:
    """multipart/form-data (RFC 7578) from bytes already read within the body cap."""
    from email.parser import BytesParser
    from email.policy import HTTP

    if "boundary=" not in content_type:
        raise MalformedBody("multipart body without a boundary")
    try:
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + raw
        )
    except Exception as exc:  # noqa: BLE001
        raise MalformedBody(f"malformed multipart body: {exc}") from None
    if not message.is_multipart():
        raise MalformedBody("malformed multipart body")
    parts: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise MalformedBody("a multipart part has no name")
        if name in parts:
            raise validation_error(f"multipart part {name!r} appears twice", (name,))
        if len(parts) >= MAX_MULTIPART_PARTS:
            raise BodyTooLarge(f"at most {MAX_MULTIPART_PARTS} multipart parts")
        payload = part.get_payload(decode=True)
        parts[str(name)] = payload if isinstance(payload, bytes) else b""
    return parts


# ----- malformed HTTP ---------------------------------------------------------------------------
class JsonErrorRequestHandler(web_protocol.RequestHandler):
    """aiohttp answers framing and header errors (bad request line, oversized headers, broken chunked
    encoding) in text/plain; answer them in the API's JSON error shape instead. Bodies reach the services as sent:
    stream_body decodes their Content-Encoding (aiohttp's decoding hung on a stream that ended early)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["auto_decompress"] = False
        super().__init__(*args, **kwargs)

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        if status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
        type_ = HTTP_ERROR_TYPES.get(status, "bad_request")
        text = (
            "internal error; see the service log"
            if status >= 500
            else (message or getattr(exc, "message", None) or str(exc or "bad request"))
        )
        response = web.json_response(
            error_body(type_, str(text)[:500]), status=status, headers={REQUEST_ID_HEADER: new_request_id()}
        )
        response.force_close()
        return response


def install_json_protocol_errors() -> None:
    web_server.RequestHandler = JsonErrorRequestHandler  # type: ignore[misc]  # aiohttp names no hook for it


def run_app(app: web.Application, host: str, port: int, on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """Serve on uvloop when it is there, with handler cancellation on: a client that disconnects cancels its
    handler (aiohttp leaves handlers running unless told), so the work it started stops with it. Without
    `on_stop`, aiohttp handles SIGTERM/SIGINT; with it, the first SIGTERM/SIGINT awaits `on_stop()` while the
    port still answers (a service drains there, refusing new work with its own error), then the server closes
    and the process exits 0."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a pinned dependency
        pass
    install_json_protocol_errors()
    app.on_startup.append(_freeze_started_heap)
    if on_stop is None:
        web.run_app(
            app, host=host, port=port, access_log=None, print=None, handle_signals=True, handler_cancellation=True
        )
        return
    asyncio.run(_serve_until_signalled(app, host, port, on_stop))


async def _freeze_started_heap(_app: web.Application) -> None:
    """What start-up made (imports, the app, its clients) out of the garbage collector's walks (jev_common.gc_pauses);
    a worker freezes again once its model is loaded."""
    freeze_heap()


async def _serve_until_signalled(
    app: web.Application, host: str, port: int, on_stop: Callable[[], Awaitable[None]]
) -> None:
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        signalled = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signalled.set)
        await signalled.wait()
        log.info("signal received: stopping")
        await on_stop()
    finally:
        await runner.cleanup()


install_json_protocol_errors()
