"""Bad input of any shape gets a JSON 4xx in the API's error shape, never a 5xx, a hang or plain text:
malformed HTTP framing, oversized request lines, paths and headers, broken chunked bodies, unknown
content encodings. Checked on the frontend (in front of the fake worker) and on the fake worker itself,
which share jev_common.http."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import pytest
from aiohttp.test_utils import TestServer

from jev_frontend.app import create_app
from jev_frontend.settings import Settings
from tests.fakes.fake_worker import FakeWorker

BODY = json.dumps({"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "y?"}}})

RAW = {
    "garbage request line": b"GARBAGE\r\n\r\n",
    "bad method characters": b"P@ST /v1/systemone HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad http version": b"POST /v1/systemone HTTP/9.7\r\nHost: x\r\n\r\n",
    "oversized path": b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "oversized header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n",
    "header without colon": b"GET /health HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n",
    "broken chunked body": (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n0\r\n\r\n"
    ),
    "conflicting lengths": (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "unknown content encoding": (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: x-unknown\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY.encode())
    ),
    "negative content length": b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
}


async def exchange(port: int, raw: bytes) -> tuple[int, dict, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(reader.readexactly(length), 10) if length else b""
        return status, headers, body
    finally:
        writer.close()


@pytest.fixture
async def servers():
    fake = FakeWorker()
    async with fake:
        front = TestServer(create_app(Settings(backend_url=fake.url)))
        await front.start_server()
        try:
            yield {"frontend": front.port, "worker": int(fake.url.rsplit(":", 1)[1])}
        finally:
            await front.close()


@pytest.mark.parametrize("name", list(RAW))
async def test_malformed_http_gets_a_json_4xx(servers, name):
    for service, port in servers.items():
        status, headers, body = await exchange(port, RAW[name])
        assert 400 <= status < 500, (service, name, status, body)
        assert headers["content-type"].startswith("application/json"), (service, name, headers)
        detail = json.loads(body)["detail"]
        assert isinstance(detail, (dict, list)), (service, name, body)
        assert headers.get("x-typesafe-request-id"), (service, name)


async def test_well_formed_raw_request_still_answers(servers):
    raw = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(BODY), BODY.encode())
    )
    for port in servers.values():
        status, headers, body = await exchange(port, raw)
        assert status == 200, body
        assert json.loads(body)["answers"]["q"]["type"] == "noul"


# --- duplicate keys and body types (jev_common.http.decode_json, check_body_type) -------------------

DUPLICATE_QUESTION = (
    b'{"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "a?"},'
    b' "q": {"type": "noul", "instructions": "b?"}}}'
)
DUPLICATE_OPTION = (
    b'{"model": "jev-latest", "state": "x", "questions": {"c": {"type": "choice", "instructions": "?",'
    b' "criteria": {"red": null, "blue": null, "red": "again"}}}}'
)


@pytest.mark.parametrize("raw,key", [(DUPLICATE_QUESTION, "q"), (DUPLICATE_OPTION, "red")], ids=["question", "option"])
async def test_a_duplicated_key_is_a_422_naming_it(servers, raw, key):
    """json.loads keeps the last of two equal keys: a question or option would vanish before the schema."""
    status, _, body = await exchange(
        servers["frontend"],
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw),
    )
    assert status == 422
    detail = json.loads(body)["detail"]
    assert detail[0]["type"] == "duplicate_key" and detail[0]["loc"] == ["body", key]
    assert f"duplicate key {key!r}" in detail[0]["msg"]


@pytest.mark.parametrize(
    "content_type,status",
    [
        ("text/xml", 415),
        ("application/x-www-form-urlencoded", 415),
        ("text/plain; charset=utf-8", 415),
        (None, 200),
        ("application/json; charset=utf-8", 200),
        ("application/vnd.api+json", 200),
    ],
)
async def test_body_types_the_api_does_not_read_are_415(servers, content_type, status):
    header = b"" if content_type is None else b"Content-Type: %s\r\n" % content_type.encode()
    got, _, body = await exchange(
        servers["frontend"],
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n%sContent-Length: "
        b"%d\r\n\r\n%s" % (header, len(BODY), BODY.encode()),
    )
    assert got == status, body
    if status == 415:
        assert json.loads(body)["detail"]["error_type"] == "unsupported_media_type"


def test_the_shared_decoder_refuses_duplicates_at_any_depth():
    from jev_common.errors import DuplicateKey
    from jev_common.http import decode_json

    assert decode_json(b'{"a": {"b": 1, "c": 2}}') == {"a": {"b": 1, "c": 2}}
    with pytest.raises(DuplicateKey, match="'b'"):
        decode_json(b'{"a": [{"b": 1, "b": 2}]}')


def compressed(encoding: str, data: bytes) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data)
    if encoding == "deflate":
        return zlib.compress(data)
    from backports.zstd import compress

    return compress(data)


def encoded_post(encoding: str, body: bytes) -> bytes:
    return (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: %s\r\nContent-Length: %d\r\n\r\n%s" % (encoding.encode(), len(body), body)
    )


ENCODINGS = ["gzip", "deflate", "zstd"]


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_body_that_does_not_decode_is_a_400_logged_as_nothing_worse(servers, encoding, caplog):
    """Found by the API fuzzing (benchmarks.fuzz_api): a body whose Content-Encoding it is not was answered 400, and
    then aiohttp read on in the broken stream, logging an 'Unhandled exception' traceback per such request."""
    for service, port in servers.items():
        caplog.clear()
        status, _, body = await exchange(port, encoded_post(encoding, BODY.encode()))
        assert status == 400 and json.loads(body)["detail"]["error_type"] == "invalid_encoding", (service, body)
        await asyncio.sleep(0.2)  # what the server does after the answer
        unhandled = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
        assert not unhandled, (service, unhandled)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("cut", ["one byte", "truncated", "empty"])
async def test_a_compressed_stream_that_ends_early_is_a_400_not_a_hang(servers, encoding, cut):
    """Found by the API fuzzing: `Content-Encoding: deflate` with the one byte `\\x00` (or any compressed stream cut
    short) left the request waiting for the rest of the stream forever: aiohttp's decoder raised past the handler,
    which never saw the body end. (exchange() gives up after 10 s.)"""
    whole = compressed(encoding, BODY.encode())
    body = {"one byte": b"\x00", "truncated": whole[: len(whole) // 2], "empty": b""}[cut]
    for service, port in servers.items():
        status, _, answer = await exchange(port, encoded_post(encoding, body))
        assert status == 400 and json.loads(answer)["detail"]["error_type"] == "invalid_encoding", (service, answer)


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_compressed_bodies_still_answer_and_stay_within_the_cap(servers, encoding):
    for service, port in servers.items():
        status, _, answer = await exchange(port, encoded_post(encoding, compressed(encoding, BODY.encode())))
        assert status == 200, (service, answer)
        twice = compressed(encoding, BODY.encode()) + compressed(encoding, b" ")  # two members, one JSON text
        status, _, answer = await exchange(port, encoded_post(encoding, twice))
        assert status == 200, (service, answer)
    bomb = compressed(encoding, b" " * (64 << 20))  # 64 MiB of spaces, past every body cap once decoded
    status, _, answer = await exchange(servers["frontend"], encoded_post(encoding, bomb))
    assert status == 413 and json.loads(answer)["detail"]["error_type"] == "body_too_large", answer


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udfff", b"\\ude00\\ud83d", b"\\ud83d"])
async def test_a_lone_surrogate_escape_is_a_422(servers, escape):
    """Found by the soak benchmark's hostile mix: `"\\ud800"` is valid JSON text but no character; the worker's L1 key
    (pydantic's JSON dump) could not encode it and answered 500."""
    raw = BODY.encode().replace(b'"x"', b'"odd ' + escape + b' text"')
    for service, port in servers.items():
        status, _, body = await exchange(port, post(raw))
        detail = json.loads(body)["detail"]
        assert status == 422 and detail[0]["type"] == "string_unicode", (service, body)


async def test_a_surrogate_pair_is_a_character_and_answered(servers):
    raw = BODY.encode().replace(b'"x"', b'"a smile \\ud83d\\ude00"')
    for service, port in servers.items():
        status, _, body = await exchange(port, post(raw))
        assert status == 200, (service, body)


async def test_a_caller_that_leaves_mid_body_is_no_server_error(servers, caplog):
    """Found by the soak benchmark's disconnecting clients: a caller that closed its connection while its body was
    read made the frontend log an 'unhandled error' and count a 500. It is the caller's leaving: nothing is logged as
    an error and the request is counted 499."""
    port = servers["frontend"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()
    await asyncio.sleep(0.5)
    assert not [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    status, _, metrics = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    text = metrics.decode()
    assert 'route="/v1/systemone",status="499"' in text and 'status="500"' not in text, text[:2000]


def post(raw: bytes) -> bytes:
    return (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (
            len(raw),
            raw,
        )
    )
