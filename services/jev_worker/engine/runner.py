"""The model runner: given a formed batch and the scheduler's plan for each of its prefixes (the state to continue,
whether to keep the state computed now, whether the prefix may be branched), run the forwards and return what the
heads read, plus the prefix states the plan keeps. It decides how, never what: which items run together, which
cached state each starts from and which states are kept are the scheduler's (scheduling/); which forward suits
the architecture is the backend's forward adapter (adapters.py); the forwards themselves are forwards.py's (or
the simulated device's, simulated.py).

Everything here runs on the single model thread, so model state and the CUDA stream are never touched
concurrently. A batch's run launches its forwards and returns with the batch's device event (`BatchOutput.ready`);
the scheduler waits on that event off this thread, which meanwhile launches the next batch.

How a group runs: after its cached state; after a state computed now when the plan keeps it or when several
rows can branch from one prefix; else whole. Single-row text groups without a state, whatever
their prefixes, share whole forwards, and a miss's KV is cut from that same forward.
"""

from __future__ import annotations

import logging
import time

import torch

from jev_common.checkpoint_files import ServingError

from ..protocols import Engine, ForwardAdapter, RequestHead
from ..scheduling.batch import BatchOutput, EngineItem, EngineResult, PrefixGroup
from ..scheduling.prefix_cache import PrefixState
from ..scheduling.reuse import LinearCost, ReuseCosts
from .adapters import TextAdapter
from .forwards import Forwards, relative_error
from .graphs import Capture, GraphRunner
from .head import DecisionHead
from .simulated import Shapes, SimulatedForwards

log = logging.getLogger("jev.worker.runner")


class ModelRunner(Engine):
    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        adapter: ForwardAdapter,
        *,
        batching: bool,
        max_batch_rows: int,
        pad_id: int = 0,
        checkpoint_dir: str | None = None,
        head=None,
        graph_capture: Capture | None = None,
        kv_budget_bytes: int = 0,
        prefill_chunk: int = 0,
        pack_tokens: int = 0,
        simulated: Shapes | None = None,
    ):
        self.adapter = adapter
        self.device = device
        if simulated is not None:
            if type(adapter) is not TextAdapter:
                raise ServingError(
                    f"the simulated device runs text causal LMs read at each row's last token; this backend's "
                    f"forward adapter is {type(adapter).__name__}"
                )
            self.forwards: Forwards | SimulatedForwards = SimulatedForwards(model, simulated, pack_tokens)
            graph_capture = None
        else:
            self.forwards = Forwards(model, device, adapter, pad_id, prefill_chunk, pack_tokens)
        # the readout's projection of a row's hidden state (FP32 logits); LM-head label rows by default
        self.head = head if head is not None else DecisionHead(model, checkpoint_dir)
        if adapter.reads == "sequence" and not isinstance(self.head, RequestHead):
            raise ServingError(
                "a forward adapter that reads whole sequences needs a readout whose head answers "
                "whole requests (a protocols.RequestHead)"
            )
        self.max_rows = max(1, max_batch_rows) if batching else 1  # rows per forward (memory), not batch policy
        # can prefix state be reused? False when the adapter says never; known after the first prefix forward
        self.kv_branching: bool | None = None if adapter.reuses_prefix else False
        if graph_capture is not None:
            if not adapter.graph_capturable:
                log.info("graph path off: the %s forward adapter is not graph-capturable", type(adapter).__name__)
            else:
                self.forwards.graphs = GraphRunner(
                    self.forwards.graph_forward,
                    self.forwards.new_cache,
                    device,
                    capture=graph_capture,
                    max_rows=self.max_rows,
                    kv_budget_bytes=kv_budget_bytes,
                    pad_id=pad_id,
                )

    @property
    def reuses_prefix(self) -> bool:
        return self.kv_branching is not False

    @property
    def graphs(self) -> GraphRunner | None:
        return self.forwards.graphs

    @graphs.setter
    def graphs(self, graphs: GraphRunner | None) -> None:
        """None turns the graph path off (every forward eager)."""
        self.forwards.graphs = graphs

    def describe(self) -> dict:
        if isinstance(self.forwards, SimulatedForwards):
            return {"simulated": self.forwards.shapes.describe()}
        return {"graphs": self.graphs.describe()} if self.graphs is not None else {}

    # ----- prefix states ------------------------------------------------------------------------
    def compute_prefix(self, item: EngineItem) -> PrefixState | None:
        """The item's prefix state, or None when this model's states cannot be branched exactly."""
        state = self.forwards.prefix_state(item.prepared.prefix_ids, item.assets)
        if state.snapshot is None:
            self.kv_branching = True
            return state
        if self.kv_branching is None:
            self.kv_branching = self._snapshot_branching_is_exact(item, state)
        return state if self.kv_branching else None

    def _snapshot_branching_is_exact(self, item: EngineItem, state: PrefixState) -> bool:
        """Once per model: continuing two copies of a snapshot must equal the whole forward, or the cache holds
        state this runner does not know how to branch, and whole forwards are used."""
        prepared, row = item.prepared, item.prepared.rows[0]
        branched = self.forwards.after([(state, row), (state, row)])
        whole = (
            self.forwards.with_images(prepared.prefix_ids, item.assets, [row])
            if item.assets
            else self.forwards.whole([(prepared.prefix_ids, row)], False)[0]
        )
        if self.adapter.reads == "last":
            error = relative_error(branched, whole)
        else:  # every position of the row: compare the row's own positions
            error = max(relative_error(h, whole[0][-len(row) :]) for h in branched)
        if error > 1e-3:
            log.warning("prefix snapshot branching differs from a whole forward (relative %.2e): disabled", error)
            return False
        return True

    # ----- the batch ----------------------------------------------------------------------------
    def _chunks(self, rows: list) -> list[list]:
        return [rows[i : i + self.max_rows] for i in range(0, len(rows), self.max_rows)]

    def _state_chunks(self, pairs: list) -> list[list]:
        """Chunks of (state, row, item) within the row limit; a snapshot state never shares a chunk with another
        state (recurrent state cannot be padded and masked)."""
        chunks: list[list] = []
        for pair in pairs:
            current = chunks[-1] if chunks else None
            if (
                current is None
                or len(current) >= self.max_rows
                or (
                    (pair[0].snapshot is not None or current[0][0].snapshot is not None)
                    and pair[0] is not current[0][0]
                )
            ):
                chunks.append([pair])
            else:
                current.append(pair)
        return chunks

    @torch.inference_mode()
    def run(self, items: list[EngineItem], groups: list[PrefixGroup]) -> BatchOutput:
        if self.adapter.reads == "sequence":
            results = [self._sequence(item) for item in items]
            return BatchOutput(results, device_s=self._device_seconds(), ready=self.forwards.completion())
        forwards = self.forwards
        hidden: dict[int, list] = {i: [] for i in range(len(items))}
        computed: dict[str, PrefixState] = {}
        whole: list[PrefixGroup] = []  # single-row text groups without a state: run whole
        after: list[tuple[PrefixState, tuple[int, ...], int]] = []  # rows after a prefix state
        shared: set[str] = set()  # groups whose later items reuse the state the first one computed
        for group in groups:
            lead = items[group.indices[0]]
            rows = [(row, i) for i in group.indices for row in items[i].prepared.rows]
            state = group.start
            if (
                state is None
                and len(rows) == 1
                and not lead.assets
                and (forwards.prefix_mode != "snapshot" or not group.keep)
            ):
                whole.append(group)  # a KV miss is cut from the whole forward itself
                continue
            if (
                state is None
                and group.branch
                and self.kv_branching is not False
                and (group.keep or (self.max_rows > 1 and len(rows) > 1))
            ):
                state = self.compute_prefix(lead)
                if group.keep and state is not None:
                    computed[group.key] = state
            if state is not None:
                shared.add(group.key)
                after.extend((state, row, i) for row, i in rows)
                continue
            for chunk in self._chunks(rows):  # no branchable state: this group's rows run whole
                chunk_rows = [row for row, _ in chunk]
                out = (
                    forwards.with_images(lead.prepared.prefix_ids, lead.assets, chunk_rows)
                    if lead.assets
                    else forwards.whole([(lead.prepared.prefix_ids, row) for row in chunk_rows], False)[0]
                )
                for h, (_, i) in zip(out, chunk):
                    hidden[i].append(h)
        for chunk in self._state_chunks(after):
            out = forwards.after([(state, row) for state, row, _ in chunk])
            for h, (_, _, i) in zip(out, chunk):
                hidden[i].append(h)
        for chunk in self._chunks(whole):
            capture = any(group.keep for group in chunk)
            out, states = forwards.whole(
                [(items[g.indices[0]].prepared.prefix_ids, items[g.indices[0]].prepared.rows[0]) for g in chunk],
                capture,
            )
            for group, h, state in zip(chunk, out, states):
                hidden[group.indices[0]].append(h)
                if group.keep and state is not None:
                    computed[group.key] = state
        results = self._results(items, groups, hidden, shared)
        return BatchOutput(results, computed, self._device_seconds(), ready=self.forwards.completion())

    def _results(self, items, groups, hidden, shared) -> list[EngineResult]:
        started = {i for group in groups if group.start is not None for i in group.indices}
        first_of_group = {group.indices[0] for group in groups}
        results = []
        for i, item in enumerate(items):
            prepared = item.prepared
            logits = [self.head.logits(h, labels) for h, labels in zip(hidden[i], prepared.row_labels)]
            # a cached state continued, or the state the group's first item computed in this batch
            reused = i in started or (prepared.prefix_key in shared and i not in first_of_group)
            results.append(EngineResult(row_logits=logits, cached_tokens=len(prepared.prefix_ids) if reused else 0))
        return results

    def _device_seconds(self) -> float | None:
        """A simulated device's seconds for the batch just launched (None on a real device)."""
        return self.forwards.take_device_seconds() if isinstance(self.forwards, SimulatedForwards) else None

    def _sequence(self, item: EngineItem) -> EngineResult:
        """One request's one sequence, read whole by a RequestHead (nothing is reused between requests)."""
        prepared = item.prepared
        hidden = self.forwards.sequence(prepared.prefix_ids + prepared.rows[0], item.assets)
        return EngineResult(row_logits=self.head.request_logits(hidden, prepared), cached_tokens=0)

    # ----- start-up -----------------------------------------------------------------------------
    def measure_reuse(
        self, lengths: tuple[int, int] = (32, 512), row_tokens: int = 16, repeats: int = 3
    ) -> ReuseCosts | None:
        """Time a row's forward with its prefix recomputed against the same row after the cached prefix state,
        at a short and a long prefix (synthetic ids): what the measured reuse policy decides with."""
        if not self.reuses_prefix:
            return None
        vocab = self.forwards.embed.num_embeddings
        row = tuple((7 + i) % vocab for i in range(row_tokens))
        points = {"recompute": [], "reuse": []}
        with torch.inference_mode():
            for length in lengths:
                prefix = tuple((1000 + 13 * i) % vocab for i in range(length))
                _, states = self.forwards.whole([(prefix, row)], True)
                if states[0] is None:
                    log.info("L3 reuse not measured: prefix states are cache snapshots")
                    return None
                state = states[0]
                recompute = self._best_time(lambda prefix=prefix: self.forwards.whole([(prefix, row)], False), repeats)
                reuse = self._best_time(lambda state=state: self.forwards.after([(state, row)]), repeats)
                points["recompute"].append((length, recompute))
                points["reuse"].append((length, reuse))
        return ReuseCosts(LinearCost.through(*points["recompute"]), LinearCost.through(*points["reuse"]))

    def _best_time(self, work, repeats: int) -> float:
        work()  # the first call may capture a graph
        best = float("inf")
        for _ in range(repeats):
            self._synchronize()
            started = time.perf_counter()
            work()
            self._synchronize()
            best = min(best, time.perf_counter() - started)
        return best

    def _synchronize(self) -> None:
        self.forwards.synchronize()
