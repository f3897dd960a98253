"""A memo that keeps only its most recently used entries.

The library memoizes what user code makes without end (grad_fn code objects,
input signatures), so a plain dict could grow for as long as a program runs.
Threads may share one: each step is one operation on an OrderedDict (atomic in
CPython), and an entry another thread dropped in between is a miss. (No lock:
torch.compile traces some of the calls, and a lock is a break in its graph.)
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")


class BoundedCache(Generic[Value]):
    """A mapping of at most ``size`` entries; adding one more drops the least recently used."""

    def __init__(self, size: int):
        self.size = size
        self._entries: collections.OrderedDict[Hashable, Value] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> Value | None:
        """The value for ``key``, now the most recently used; None where there is none."""
        try:
            self._entries.move_to_end(key)
            return self._entries[key]
        except KeyError:
            return None

    def put(self, key: Hashable, value: Value) -> Value:
        """Keeps ``value`` for ``key``; returns it."""
        self._entries.pop(key, None)
        self._entries[key] = value  # the most recent: last
        while len(self._entries) > self.size:
            try:
                self._entries.popitem(last=False)
            except KeyError:  # another thread emptied it
                break
        return value

    def clear(self) -> None:
        """Drops every entry."""
        self._entries.clear()
