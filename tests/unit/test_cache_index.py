"""The Redis cache index (jev_common.index, as a worker holds it) and the worker's AssetStore on top of
it: namespaces, degradation to the filesystem when Redis is down, stale entries. Each test uses its own
identity (so its own key namespace) and deletes that namespace afterwards."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import socket
import uuid

import pytest

from jev_common.assets import asset_key
from jev_common.errors import DomainError
from jev_common.index import IndexConnection, IndexUnavailable, namespace, owners as owner_hash
from jev_common.index.assets import AssetIndex
from jev_common.index.connection import DEFAULT_BACKOFF_S
from jev_common.index.owners import DEFAULT_OWNER_TTL_S, Owner
from jev_common.index.routes import entry_key as route_entry_key, route_owners
from jev_preencoder.settings import PreencoderSettings
from jev_worker.loading.vision import AssetStore
from jev_worker.registration import WorkerIndex

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
    made: list[WorkerIndex] = []

    def make(
        identity: str | None = None,
        url: str | None = None,
        owner_id: str = "w",
        owner_url: str = "",
        prefix_ttl_s: float = DEFAULT_OWNER_TTL_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
    ) -> WorkerIndex:
        index = WorkerIndex.over(
            IndexConnection(url or redis_url, backoff_s=backoff_s),
            identity or f"test/{uuid.uuid4().hex}@1",
            Owner(owner_id, owner_url),
            prefix_ttl_s,
        )
        made.append(index)
        return index

    yield make
    for index in made:
        if index.connection.url == redis_url:
            try:
                await index.connection.purge(index.ns)
            except IndexUnavailable:
                pass
        await index.close()


@needs_redis
async def test_register_lookup_and_namespace_isolation(index_factory):
    a, b = index_factory().assets, index_factory().assets
    assert a.ns != b.ns and a.ns == namespace(a.identity)
    key = "e" * 64
    assert await a.lookup(key) is None
    await a.register(key, grid=[1, 4, 4], nbytes=1024, path="/assets/" + key, n_tokens=4, dtype="float32")
    entry = await a.lookup(key)
    assert entry["grid"] == [1, 4, 4] and entry["nbytes"] == 1024 and entry["path"] == "/assets/" + key
    assert entry["identity"] == a.identity and entry["n_tokens"] == 4
    assert await b.lookup(key) is None  # another checkpoint never sees it
    same = index_factory(identity=a.identity).assets
    assert (await same.lookup(key))["nbytes"] == 1024
    await a.remove(key)
    assert await same.lookup(key) is None
    assert (await a.connection.health(a.ns))["status"] == "ok"


@needs_redis
async def test_route_owners(index_factory):
    index = index_factory(owner_id="w1", owner_url="http://w1:8000")
    other = index_factory(identity=index.assets.identity, owner_id="w2", owner_url="http://w2:8000")
    conn, entry = index.connection, route_entry_key(index.ns, "p" * 64)
    assert await route_owners(conn, index.ns, "p" * 64) == []
    await index.routes.register("p" * 64)
    await other.routes.register("p" * 64)
    await owner_hash.put(conn, "test", entry, Owner("w3", "http://w3:8000"), -1)  # already expired
    owners = await route_owners(conn, index.ns, "p" * 64)
    assert [(o.worker_id, o.url) for o in owners] == [("w1", "http://w1:8000"), ("w2", "http://w2:8000")]
    client = conn.redis()
    assert "w3" not in await client.hkeys(entry)  # expired owner pruned
    assert 0 < await client.ttl(entry) <= index.routes.ttl_s
    await index.routes.unregister("p" * 64)
    assert [o.worker_id for o in await route_owners(conn, index.ns, "p" * 64)] == ["w2"]
    assert await route_owners(conn, index_factory().ns, "p" * 64) == []  # other namespace


async def test_redis_down_raises_index_unavailable_and_health_degrades(index_factory):
    index = index_factory(url=DEAD_URL, backoff_s=60)
    with pytest.raises(IndexUnavailable, match="ConnectionError"):
        await index.assets.lookup("f" * 64)
    with pytest.raises(IndexUnavailable, match="back-off"):  # no new connection attempt during the back-off
        await index.assets.register("f" * 64, grid=[1, 4, 4], nbytes=1, path="/x")
    with pytest.raises(IndexUnavailable):
        await route_owners(index.connection, index.ns, "p" * 64)
    health = await index.connection.health(index.ns)
    assert health["status"] == "degraded" and "ConnectionError" in health["reason"]
    assert index.connection.stats()["errors"] >= 1
    disabled = AssetIndex(IndexConnection(""), "test/x@1")
    assert (await disabled.connection.health(disabled.ns))["status"] == "degraded"
    with pytest.raises(IndexUnavailable, match="disabled"):
        await disabled.lookup("f" * 64)


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
    store = AssetStore(str(folder), index_factory(encoder.identity, url=DEAD_URL).assets, encoder.identity, 1 << 20)
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
    index = index_factory(encoder.identity).assets
    # the index names a copy somewhere else: the store reads that one
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    key0 = asset_key(uris[0])
    shutil.copytree(folder / key0, elsewhere / key0)
    await index.register(key0, grid=[1, 4, 4], nbytes=1024, path=str(elsewhere / key0))
    store = AssetStore(str(tmp_path / "empty"), index, encoder.identity, 0)  # L2 off: every get reads
    asset, hit = await store.get(uris[0])
    assert not hit and asset.n_tokens == 4 and store.counters()["index_hits"] == 1
    # the file behind the entry is deleted: not prepared, and the stale entry is gone
    shutil.rmtree(elsewhere / key0)
    with pytest.raises(DomainError) as info:
        await store.get(uris[0])
    assert info.value.type == "asset_not_prepared" and key0 in info.value.message
    assert await index.lookup(key0) is None and store.counters()["stale_removed"] == 1
    # L2 off: nothing resident, every request rereads
    assert store.counters()["resident_bytes"] == 0 and store.stats().enabled is False


@needs_redis
async def test_preencoder_registers_assets_in_the_index(tmp_path, capsys, monkeypatch, index_factory, redis_url):
    from jev_preencoder.cli import main

    monkeypatch.delenv("JEV_RECIPE", raising=False)
    monkeypatch.setattr("jev_preencoder.cli.configure_logging", lambda _command: None)
    identity = tiny_encoder().identity
    index = index_factory(identity).assets
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
    entry = await index.lookup(asset_key(uri))
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
async def test_own_routes_stay_fresh_while_resident_and_leave_with_the_owner(index_factory):
    index = index_factory(owner_id="w1", owner_url="http://w1:8000", prefix_ttl_s=0.6)
    other = index_factory(identity=index.assets.identity, owner_id="w2", owner_url="http://w2:8000")

    async def warm(route_key: str) -> list:
        return await route_owners(other.connection, other.ns, route_key)

    await index.routes.register("a" * 64)
    await index.routes.register("b" * 64)
    await other.routes.register("a" * 64)
    await asyncio.sleep(1.5)  # > 2 TTLs: only the refresh keeps them
    assert [o.worker_id for o in await warm("a" * 64)] == ["w1", "w2"]
    assert [o.worker_id for o in await warm("b" * 64)] == ["w1"]
    await index.routes.unregister("b" * 64)
    await asyncio.sleep(1.0)  # an unregistered route is not brought back by the refresh
    assert await warm("b" * 64) == []
    await index.routes.register("c" * 64)
    assert await index.unregister_owner() == 2  # a and c
    assert [o.worker_id for o in await warm("a" * 64)] == ["w2"]
    assert await warm("c" * 64) == []
    await asyncio.sleep(0.5)
    assert await warm("c" * 64) == []  # nothing left to refresh


def test_default_prefix_ttl_is_short():
    assert DEFAULT_OWNER_TTL_S <= 120  # a crashed worker's entries go within two minutes


@needs_redis
async def test_a_stopped_worker_leaves_no_prefix_entry(worker_settings, redis_url):
    """The warmup decision registers its state's route key (its prefix entered L3); stopping the worker removes it
    from the index."""
    from jev_worker.service import WorkerService

    worker_id = f"stop-test-{uuid.uuid4().hex[:8]}"
    service = WorkerService(worker_settings(redis_url=redis_url, worker_id=worker_id, worker_url="http://127.0.0.1:9"))
    await service.start()
    assert service.state == "ok", service.error
    index = IndexConnection(redis_url)
    try:
        client = index.redis()

        async def mine() -> list[str]:
            return [
                key
                async for key in client.scan_iter(match=f"jev:{namespace(service.identity)}:route:*")
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


@needs_redis
async def test_a_worker_writes_only_key_spaces_that_are_read(worker_settings, redis_url):
    """After its warmup decision a worker's namespace holds route entries (read by frontends) and nothing else of
    its own: no key space without a reader (the former `prefix` entries were read by no production code)."""
    from jev_worker.service import WorkerService

    worker_id = f"spaces-test-{uuid.uuid4().hex[:8]}"
    service = WorkerService(worker_settings(redis_url=redis_url, worker_id=worker_id, worker_url="http://127.0.0.1:9"))
    await service.start()
    assert service.state == "ok", service.error
    connection = IndexConnection(redis_url)
    try:
        client = connection.redis()

        async def spaces() -> set[str]:
            names = [key async for key in client.scan_iter(match=f"jev:{namespace(service.identity)}:*")]
            return {name.split(":")[2] for name in names if await client.hexists(name, worker_id)}

        for _ in range(50):  # registration is fire-and-forget on the event loop
            if await spaces():
                break
            await asyncio.sleep(0.02)
        assert await spaces() == {"route"}
    finally:
        await service.stop()
        await connection.close()
