"""A TCP proxy that adds latency and drops connections on one path, controlled at run time (the failure drills,
tools/netdrill.py: this kernel has no netem, so a slow or lossy link is made here).

    python -m tools.fault_proxy --listen 0.0.0.0:8001 --upstream 127.0.0.1:8000 --control /run/x/proxy.json

The control file (JSON, re-read every 0.2 s) holds `delay_ms` (added before each chunk is forwarded, both ways)
and `drop` (the share of new connections reset at once, 0..1); missing or unreadable: no fault.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path


class Faults:
    def __init__(self, control: Path | None):
        self.control = control
        self.delay_s = 0.0
        self.drop = 0.0

    async def watch(self) -> None:
        while True:
            try:
                settings = json.loads(self.control.read_text()) if self.control else {}
            except (OSError, ValueError):
                settings = {}
            self.delay_s = max(0.0, float(settings.get("delay_ms", 0))) / 1000
            self.drop = min(1.0, max(0.0, float(settings.get("drop", 0))))
            await asyncio.sleep(0.2)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, faults: Faults) -> None:
    try:
        while chunk := await reader.read(65536):
            if faults.delay_s:
                await asyncio.sleep(faults.delay_s)
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def serve(listen: str, upstream: str, faults: Faults) -> None:
    up_host, up_port = upstream.rsplit(":", 1)

    async def handle(reader, writer):
        if faults.drop and random.random() < faults.drop:
            writer.transport.abort()  # a reset: what a lossy link does to a connection, seen from the caller
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(up_host, int(up_port))
        except OSError:
            writer.transport.abort()
            return
        await asyncio.gather(pipe(reader, up_writer, faults), pipe(up_reader, writer, faults))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port))
    async with server:
        await asyncio.gather(server.serve_forever(), faults.watch())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--control", type=Path)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.upstream, Faults(args.control)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
