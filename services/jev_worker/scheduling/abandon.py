"""A running forward stops when nobody waits for it any more.

Before each transformer layer (a forward pre-hook on every block of the model's layer stack), the forward asks
whether any job of its batch is still wanted (its client waits and its deadline has not passed, and the worker
is not aborting for a shutdown). When none is, the layer raises `ForwardAbandoned`: the model thread is free
within one layer's time instead of computing rows whose answers nobody will read (a 255-option prompt on two
CPU cores is about a minute of work). Long prompts are prefilled in chunks (engine.py), so a layer step is
short whatever the prompt's length, and the check runs within one chunk's layer.

Every layer also stamps `last_progress`: health reads it to tell a worker that is computing from one that is
stuck (no layer finished for longer than its stall limit while a batch runs).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import torch

log = logging.getLogger("jev.worker.abandon")


class ForwardAbandoned(Exception):
    """Raised inside a forward whose batch nobody waits for; `layer` of `layers` is where it stopped."""

    def __init__(self, layer: int, layers: int, chunk: int = 0):
        super().__init__(f"forward abandoned before layer {layer} of {layers}")
        self.layer = layer
        self.layers = layers
        self.chunk = chunk  # the prefill chunk it stopped in (0: the first, or an unchunked forward)


def layer_stack(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's stack of transformer blocks: the longest ModuleList whose items are all of one class."""
    best = None
    for module in model.modules():
        if (
            isinstance(module, torch.nn.ModuleList)
            and len(module) > 1
            and len({type(m) for m in module}) == 1
            and (best is None or len(module) > len(best))
        ):
            best = module
    return best


class LayerChecks:
    """Pre-hooks on every block of `model`'s layer stack that stop a forward nobody wants (`watching`).

    The hooks are installed once; between batches (no `wanted` set) they cost one attribute read per layer.
    """

    def __init__(self, model: torch.nn.Module):
        self._wanted: Callable[[], bool] | None = None
        self._thread: int | None = None
        self.last_progress = time.monotonic()  # the last layer started (or batch begun), on any thread
        stack = layer_stack(model)
        self.layers = len(stack) if stack is not None else 0
        if stack is None:
            log.warning("no layer stack found in %s: forwards are not stopped between layers", type(model).__name__)
            return
        for index, block in enumerate(stack):
            block.register_forward_pre_hook(self._hook(index))

    def _hook(self, index: int):
        def check(_module, _args):
            self.last_progress = time.monotonic()
            wanted = self._wanted
            if wanted is not None and threading.get_ident() == self._thread and not wanted():
                raise ForwardAbandoned(index, self.layers)

        return check

    @contextlib.contextmanager
    def watching(self, wanted: Callable[[], bool]):
        """While inside, every layer of a forward on this thread first checks `wanted()`."""
        self._wanted, self._thread = wanted, threading.get_ident()
        self.last_progress = time.monotonic()
        try:
            yield
        finally:
            self._wanted = self._thread = None
