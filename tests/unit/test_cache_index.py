"""The Redis cache index and the worker's AssetStore on top of it: namespaces, degradation to the
filesystem when Redis is down, stale entries. Each test uses its own identity (so its own key
namespace) and deletes that namespace afterwards."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import socket
import uuid

import pytest

from jev_common.assets import asset_key
from jev_common.cache_index import CacheIndex, IndexUnavailable, namespace
from jev_common.errors import DomainError
from jev_preencoder.settings import PreencoderSettings
from jev_worker.loading.vision import AssetStore

from .vl_helpers import png_uri, request_line, tiny_encoder, tiny_vl_checkpoint

DEAD_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1: connection refused at once


def _redis_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


needs_redis = pytest.mark.skipif(not _redis_up(), reason="no Redis at 127.0.0.1:6379 (make test starts one)")


@pytest.fixture
def redis_url() -> str:
    """A random logical db besides the namespace: tests on the tiny checkpoint share its identity."""
    return f"redis://127.0.0.1:6379/{random.randint(1, 15)}"


@pytest.fixture
async def index_factory(redis_url):
    made: list[CacheIndex] = []

    def make(identity: str | None = None, url: str | None = None, **kwargs) -> CacheIndex:
        index = CacheIndex(url or redis_url, identity or f"test/{uuid.uuid4().hex}@1", **kwargs)
        made.append(index)
        return index

    yield make
    for index in made:
        if index.url == redis_url:
            try:
                await index.purge_namespace()
            except IndexUnavailable:
                pass
        await index.close()


@needs_redis
async def test_register_lookup_and_namespace_isolation(index_factory):
    a, b = index_factory(), index_factory()
    assert a.ns != b.ns and a.ns == namespace(a.identity)
    key = "e" * 64
    assert await a.lookup_asset(key) is None
    await a.register_asset(key, grid=[1, 4, 4], nbytes=1024, path="/assets/" + key, n_tokens=4, dtype="float32")
    entry = await a.lookup_asset(key)
    assert entry["grid"] == [1, 4, 4] and entry["nbytes"] == 1024 and entry["path"] == "/assets/" + key
    assert entry["identity"] == a.identity and entry["n_tokens"] == 4
    assert await b.lookup_asset(key) is None  # another checkpoint never sees it
    same = index_factory(identity=a.identity)
    assert (await same.lookup_asset(key))["nbytes"] == 1024
    await a.remove_asset(key)
    assert await same.lookup_asset(key) is None
    assert (await a.health())["status"] == "ok"


@needs_redis
async def test_prefix_owners(index_factory):
    index = index_factory(owner_id="w1", owner_url="http://w1:8000")
    other = index_factory(identity=index.identity)
    assert await index.where_is_prefix_warm("p" * 64) == []
    await index.register_prefix("p" * 64, None, 120, 4096)
    await other.register_prefix("p" * 64, {"worker_id": "w2", "url": "http://w2:8000"})
    await other.register_prefix("p" * 64, "w3", url="http://w3:8000", ttl_s=-1)  # already expired
    owners = await index.where_is_prefix_warm("p" * 64)
    assert [(o.worker_id, o.url) for o in owners] == [("w1", "http://w1:8000"), ("w2", "http://w2:8000")]
    assert owners[0].length == 120 and owners[0].nbytes == 4096
    client = index._redis()
    assert "w3" not in await client.hkeys(index.prefix_entry_key("p" * 64))  # expired owner pruned
    assert 0 < await client.ttl(index.prefix_entry_key("p" * 64)) <= index.prefix_ttl_s
    await index.unregister_prefix("p" * 64, {"worker_id": "w1"})
    assert [o.worker_id for o in await index.where_is_prefix_warm("p" * 64)] == ["w2"]
    assert await index_factory().where_is_prefix_warm("p" * 64) == []  # other namespace


async def test_redis_down_raises_index_unavailable_and_health_degrades(index_factory):
    index = index_factory(url=DEAD_URL, backoff_s=60)
    with pytest.raises(IndexUnavailable, match="ConnectionError"):
        await index.lookup_asset("f" * 64)
    with pytest.raises(IndexUnavailable, match="back-off"):  # no new connection attempt during the back-off
        await index.register_asset("f" * 64, grid=[1, 4, 4], nbytes=1, path="/x")
    with pytest.raises(IndexUnavailable):
        await index.where_is_prefix_warm("p" * 64)
    health = await index.health()
    assert health["status"] == "degraded" and "ConnectionError" in health["reason"]
    assert index.stats()["errors"] >= 1
    disabled = CacheIndex("", "test/x@1")
    assert (await disabled.health())["status"] == "degraded"
    with pytest.raises(IndexUnavailable, match="disabled"):
        await disabled.lookup_asset("f" * 64)


@pytest.fixture
async def prepared(tmp_path):
    """Two images encoded into tmp_path/assets by the tiny preencoder (no index)."""
    encoder = tiny_encoder()
    uris = [png_uri(61), png_uri(62)]
    summary = await encoder.encode_lines([request_line(u) for u in uris], str(tmp_path / "assets"), None)
    assert summary.done == 2
    return encoder, uris, tmp_path / "assets"


async def test_asset_store_falls_back_to_files_when_redis_is_down(prepared, index_factory):
    encoder, uris, folder = prepared
    store = AssetStore(str(folder), index_factory(encoder.identity, url=DEAD_URL), encoder.identity, 1 << 20)
    asset, hit = await store.get(uris[0])
    assert not hit and asset.key == asset_key(uris[0]) and asset.grid_thw == (1, 4, 4)
    asset_again, hit = await store.get(uris[0])
    assert hit and asset_again is asset
    counters = store.counters()
    assert counters["hits"] == 1 and counters["misses"] == 1 and counters["index_unavailable"] == 1
    assert counters["resident_bytes"] == asset.nbytes and counters["disk_reads"] == 1
    with pytest.raises(DomainError) as info:
        await store.get(png_uri(63))
    assert info.value.type == "asset_not_prepared" and asset_key(png_uri(63)) in info.value.message


@needs_redis
async def test_asset_store_uses_the_index_and_drops_stale_entries(prepared, index_factory, tmp_path):
    encoder, uris, folder = prepared
    index = index_factory(encoder.identity)
    # the index names a copy somewhere else: the store reads that one
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    key0 = asset_key(uris[0])
    shutil.copytree(folder / key0, elsewhere / key0)
    await index.register_asset(key0, grid=[1, 4, 4], nbytes=1024, path=str(elsewhere / key0))
    store = AssetStore(str(tmp_path / "empty"), index, encoder.identity, 0)  # L2 off: every get reads
    asset, hit = await store.get(uris[0])
    assert not hit and asset.n_tokens == 4 and store.counters()["index_hits"] == 1
    # the file behind the entry is deleted: not prepared, and the stale entry is gone
    shutil.rmtree(elsewhere / key0)
    with pytest.raises(DomainError) as info:
        await store.get(uris[0])
    assert info.value.type == "asset_not_prepared" and key0 in info.value.message
    assert await index.lookup_asset(key0) is None and store.counters()["stale_removed"] == 1
    # L2 off: nothing resident, every request rereads
    assert store.counters()["resident_bytes"] == 0 and store.stats().enabled is False


@needs_redis
async def test_preencoder_registers_assets_in_the_index(tmp_path, capsys, monkeypatch, index_factory, redis_url):
    from jev_preencoder.cli import main

    monkeypatch.delenv("JEV_RECIPE", raising=False)
    monkeypatch.setattr("jev_preencoder.cli.configure_logging", lambda _command: None)
    identity = tiny_encoder().identity
    index = index_factory(identity)
    manifest = tmp_path / "m.jsonl"
    uri = png_uri(71)
    manifest.write_text(json.dumps(request_line(uri)) + "\n")
    out = tmp_path / "assets"
    argv = [
        "encode",
        "--manifest",
        str(manifest),
        "--out",
        str(out),
        "--model",
        tiny_vl_checkpoint(),
        "--redis",
        redis_url,
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--no-progress",
    ]
    code = await asyncio.to_thread(main, argv)  # the CLI runs its own event loop
    assert code == 0, capsys.readouterr().err
    entry = await index.lookup_asset(asset_key(uri))
    assert entry["path"] == str((out / asset_key(uri)).resolve()) and entry["grid"] == [1, 4, 4]
    assert entry["nbytes"] == 4 * 64 * 4 and entry["identity"] == identity
    # an identity mismatch between the index's namespace and the file is still caught by the file
    store = AssetStore(str(out), index, "some/other@1", 1 << 20)
    with pytest.raises(DomainError) as info:
        await store.get(uri)
    assert info.value.type == "asset_invalid"


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("JEV_PREENCODER_PORT", "9191")
    monkeypatch.setenv("JEV_ASSET_DIR", "/data/assets")
    monkeypatch.setenv("JEV_REDIS_URL", "redis://r:6379/2")
    monkeypatch.setenv("JEV_PREENCODER_MAX_IMAGE_BYTES", "2M")
    settings = PreencoderSettings.from_env(asset_dir=None)
    assert settings.port == 9191 and settings.asset_dir == "/data/assets" and settings.redis_url.endswith("/2")
    assert settings.max_image_bytes == 2 << 20
    assert PreencoderSettings.from_env(asset_dir="/other").asset_dir == "/other"


@needs_redis
async def test_own_prefixes_stay_fresh_while_resident_and_leave_with_the_owner(index_factory):
    index = index_factory(owner_id="w1", owner_url="http://w1:8000", prefix_ttl_s=0.6)
    other = index_factory(identity=index.identity, owner_id="w2", owner_url="http://w2:8000")
    await index.register_prefix("a" * 64, None, 10, 100)
    await index.register_prefix("b" * 64, None, 20, 200)
    await other.register_prefix("a" * 64)
    await asyncio.sleep(1.5)  # > 2 TTLs: only the refresh keeps them
    assert [o.worker_id for o in await other.where_is_prefix_warm("a" * 64)] == ["w1", "w2"]
    assert [o.length for o in await other.where_is_prefix_warm("b" * 64)] == [20]
    await index.unregister_prefix("b" * 64)
    await asyncio.sleep(1.0)  # an unregistered prefix is not brought back by the refresh
    assert await other.where_is_prefix_warm("b" * 64) == []
    await index.register_prefix("c" * 64)
    assert await index.unregister_owner() == 2  # a and c
    assert [o.worker_id for o in await other.where_is_prefix_warm("a" * 64)] == ["w2"]
    assert await other.where_is_prefix_warm("c" * 64) == []
    await asyncio.sleep(0.5)
    assert await other.where_is_prefix_warm("c" * 64) == []  # nothing left to refresh


def test_default_prefix_ttl_is_short():
    from jev_common.cache_index import DEFAULT_PREFIX_TTL_S

    assert DEFAULT_PREFIX_TTL_S <= 120  # a crashed worker's entries go within two minutes


@needs_redis
async def test_a_stopped_worker_leaves_no_prefix_entry(worker_settings, redis_url):
    """The warmup decision registers its prefix; stopping the worker removes it from the index."""
    from jev_worker.service import WorkerService

    worker_id = f"stop-test-{uuid.uuid4().hex[:8]}"
    service = WorkerService(worker_settings(redis_url=redis_url, worker_id=worker_id, worker_url="http://127.0.0.1:9"))
    await service.start()
    assert service.state == "ok", service.error
    index = CacheIndex(redis_url, service.identity)
    try:
        client = index._redis()

        async def mine() -> list[str]:
            return [
                key
                async for key in client.scan_iter(match=f"jev:{index.ns}:prefix:*")
                if await client.hexists(key, worker_id)
            ]

        for _ in range(50):  # registration is fire-and-forget on the event loop
            if await mine():
                break
            await asyncio.sleep(0.02)
        assert await mine(), "the warmup prefix was never registered"
        await service.stop()
        assert await mine() == []
    finally:
        await index.close()
