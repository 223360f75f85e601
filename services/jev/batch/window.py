"""Grouping by state over a bounded window of the input.

The runner reads ahead at most `limit` lines; the lines read and not yet sent wait here, grouped by state
(`Line.group`: model, state and assets). A group is sent whole before the next begins, so a state's requests reach
the worker together and share its prefix (one prefix computed, the other rows after its state); the next group is
the one whose first line is oldest, so a line is sent once the groups read before it are. A line read while its
state's group is being sent joins it. Memory: the window's lines (at most `limit` requests, as read).
"""

from __future__ import annotations

from collections import OrderedDict, deque

from .inputs import Line


class StateWindow:
    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._groups: OrderedDict[str, deque[tuple[int, Line]]] = OrderedDict()  # by oldest first line
        self._current: str | None = None  # the group being sent
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def full(self) -> bool:
        return self._size >= self.limit

    def add(self, seq: int, line: Line) -> None:
        self._groups.setdefault(line.group, deque()).append((seq, line))
        self._size += 1

    def pop(self) -> tuple[int, Line]:
        """The next line to send: the current group's next, else the oldest group's first."""
        current = self._current
        if current is None or current not in self._groups:
            current = self._current = next(iter(self._groups))
        group = self._groups[current]
        item = group.popleft()
        if not group:  # done: the next pop takes the oldest group, even if more of this state is read meanwhile
            del self._groups[current]
            self._current = None
        self._size -= 1
        return item
