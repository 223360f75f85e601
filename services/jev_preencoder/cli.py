"""python -m jev_preencoder encode --manifest FILE.jsonl --out DIR [--model PATH|--recipe NAME] [--redis URL]
python -m jev_preencoder serve

encode exits 0 when every line is done or skipped, 1 when any line failed, 2 when it could not start
(no model, unreadable manifest).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from jev_common.logs import setup_logging

from .settings import PreencoderSettings

log = logging.getLogger("jev.preencoder")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jev_preencoder", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    enc = sub.add_parser("encode", help="encode the images of a JSONL manifest into assets")
    enc.add_argument(
        "--manifest", required=True, help="JSONL file, one DecisionRequest-shaped object per line ('-': stdin)"
    )
    enc.add_argument("--out", help="asset folder (default JEV_ASSET_DIR)")
    enc.add_argument("--model", help="local checkpoint folder (default JEV_MODEL_PATH)")
    enc.add_argument("--recipe", help="recipe name or folder (default JEV_RECIPE)")
    enc.add_argument("--redis", help="cache index URL (default JEV_REDIS_URL); 'none' to skip the index")
    enc.add_argument("--device", help="cpu, cuda, cuda:1, auto (default JEV_DEVICE)")
    enc.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="default: the recipe's")
    enc.add_argument("--json", action="store_true", help="print per-line results and the summary as JSON on stdout")
    enc.add_argument("--no-progress", action="store_true", help="no progress bar")
    sub.add_parser("serve", help="HTTP service: POST /v1/preencode, GET /health, GET /metrics")
    return parser


def _count_lines(path: str) -> int | None:
    if path == "-":
        return None
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def _lines(path: str):
    if path == "-":
        yield from sys.stdin
        return
    with open(path, encoding="utf-8", errors="replace") as handle:
        yield from handle


async def _encode(args, settings: PreencoderSettings) -> int:
    from tqdm import tqdm

    from jev_common.checkpoint_files import ServingError
    from jev_common.index import IndexConnection
    from jev_common.index.assets import AssetIndex

    from .encode import Encoder, ModelNotAvailable

    try:
        total = _count_lines(args.manifest)
    except OSError as exc:
        print(f"preencode: cannot read manifest {args.manifest}: {exc}", file=sys.stderr)
        return 2
    try:
        encoder = Encoder(settings)
    except (ModelNotAvailable, ServingError, FileNotFoundError, OSError, ValueError) as exc:
        print(f"preencode: cannot load the model: {exc}", file=sys.stderr)
        return 2
    index = None
    if settings.redis_url and settings.redis_url.lower() != "none":
        index = AssetIndex(IndexConnection(settings.redis_url), encoder.identity)
        health = await index.connection.health(index.ns)
        if health["status"] != "ok":
            print(f"preencode: cache index degraded ({health['reason']}); writing assets only", file=sys.stderr)
    progress = tqdm(total=total, unit="line", desc="preencode", file=sys.stderr, disable=args.no_progress)
    try:
        summary = await encoder.encode_lines(_lines(args.manifest), settings.asset_dir, index, progress=progress)
    finally:
        progress.close()
        if index is not None:
            await index.connection.close()
    for result in summary.results:
        if result.status == "failed":
            print(f"FAILED {result.message} [{result.reason}]", file=sys.stderr)
    if args.json:
        json.dump(
            {
                "results": [r.answered() for r in summary.results],
                "summary": summary.counts(),
                "identity": encoder.identity,
            },
            sys.stdout,
        )
        sys.stdout.write("\n")
    print(summary.line(), file=sys.stderr)
    return 1 if summary.failed else 0


def configure_logging(command: str) -> None:
    setup_logging("preencoder", capture_stderr=command == "serve")  # encode talks to a person on stderr
    if command == "encode" and "JEV_LOG_LEVEL" not in os.environ:
        logging.getLogger().setLevel(logging.WARNING)  # the CLI speaks through its progress bar and summary


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.command)
    if args.command == "serve":
        from .service import serve

        serve(PreencoderSettings.for_serving())
        return 0
    settings = PreencoderSettings.from_env(
        recipe=args.recipe,
        model_path=args.model,
        asset_dir=args.out,
        redis_url=args.redis,
        device=args.device,
        dtype=args.dtype,
    )
    return asyncio.run(_encode(args, settings))
