"""Worker benchmark: L3 prefix cache on vs off and candidate batching on vs off, side by side.

    python -m benchmarks.worker_bench [--model smollm2|tiny] [--requests N] [--out benchmarks/out]

The `l3` and `batching` groups of benchmarks.run_all (same workers, corpora and columns: see
docs/benchmarks.md), straight to the worker processes without the frontend, on the embedded
SmolLM2-135M by default. Writes worker_bench.json and worker_bench.md under --out.
"""

from __future__ import annotations

import sys

from .run_all import parse_args, run

GROUPS = ("l3", "batching")


def main(argv: list[str] | None = None) -> int:
    return run(
        parse_args(argv, description=__doc__, default_groups=GROUPS), stem="worker_bench", title="jev worker benchmark"
    )


if __name__ == "__main__":
    sys.exit(main())
