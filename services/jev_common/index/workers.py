"""`jev:worker:{worker_id}` and `jev:workers`: worker discovery. A worker writes its record (JSON {worker_id, url,
model, ns, state, queue_depth, max_queue, updated}) with a short TTL (`WORKER_TTL_S`, refreshed every TTL/3 by a
live worker) and adds its id to the `jev:workers` set; a frontend reads the set and the records to find workers,
pruning ids whose record expired. Not namespaced: a frontend learns each worker's `ns` from its record."""

from __future__ import annotations

import json
import time
from typing import Any

from .connection import IndexConnection

WORKER_TTL_S = 10.0  # a dead worker's registration lingers at most this long
WORKERS_SET = "jev:workers"


def record_key(worker_id: str) -> str:
    return f"jev:worker:{worker_id}"


class WorkerDirectory:
    def __init__(self, connection: IndexConnection) -> None:
        self.connection = connection

    async def register(self, record: dict[str, Any], ttl_s: float = WORKER_TTL_S) -> bool:
        """(worker) Announce a worker (model, url, ns, health, queue depth) for `ttl_s`; call again to refresh.
        Returns whether its record was still there (False: a first announcement, or an index that lost it)."""
        worker_id = str(record["worker_id"])
        payload = json.dumps({**record, "updated": time.time()})

        async def run(r: Any) -> list[Any]:
            async with r.pipeline(transaction=True) as pipe:
                pipe.exists(record_key(worker_id))
                pipe.set(record_key(worker_id), payload, ex=max(1, int(ttl_s + 0.999)))
                pipe.sadd(WORKERS_SET, worker_id)
                return list(await pipe.execute())

        existed, *_ = await self.connection.call("register_worker", run)
        return bool(existed)

    async def unregister(self, worker_id: str) -> None:
        """(worker) A clean stop: the record and the id go at once."""

        async def run(r: Any) -> Any:
            async with r.pipeline(transaction=True) as pipe:
                pipe.delete(record_key(worker_id))
                pipe.srem(WORKERS_SET, worker_id)
                return await pipe.execute()

        await self.connection.call("unregister_worker", run)

    async def list(self) -> list[dict[str, Any]]:
        """(frontend) Every live worker registration; ids whose record expired (a dead host) are pruned."""

        async def run(r: Any) -> list[str]:
            ids = sorted(await r.smembers(WORKERS_SET))
            if not ids:
                return []
            values = await r.mget([record_key(i) for i in ids])
            gone = [i for i, v in zip(ids, values, strict=True) if v is None]
            if gone:
                await r.srem(WORKERS_SET, *gone)
            return [v for v in values if v is not None]

        records = []
        for raw in await self.connection.call("list_workers", run):
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("worker_id") and record.get("url"):
                records.append(record)
        return records
