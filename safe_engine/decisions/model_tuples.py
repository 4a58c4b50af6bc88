"""A value built once per tuple of models (a vocabulary union, an alignment) and held only while they live."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from ..models.loading import LoadedModel

T = TypeVar("T")


class ModelTupleCache(Generic[T]):
    """What `build` makes of a tuple of models, for the last few tuples (`size`), held only while their models live.

    An entry is keyed by the models' id()s and keeps weak references to them: it is served only to the very
    same models (a tuple of later models that reuse freed ids is computed afresh) and is dropped once one of
    its models is gone, at the next look-up; the least recently used goes past `size`."""

    def __init__(self, build: Callable[[tuple[LoadedModel, ...]], T], size: int = 4):
        self.build = build
        self.size = size
        self._entries: OrderedDict[tuple[int, ...], tuple[tuple[weakref.ref, ...], T]]
        self._entries = OrderedDict()
        self._lock = threading.Lock()

    def get(self, lms: tuple[LoadedModel, ...]) -> T:
        """`build(lms)`, built once while these very models live."""
        key = tuple(id(lm) for lm in lms)
        with self._lock:
            for k in [k for k, (refs, _) in self._entries.items() if any(ref() is None for ref in refs)]:
                del self._entries[k]  # one of its models was freed: its ids may come back on other models
            entry = self._entries.get(key)
            if entry is not None and all(ref() is lm for ref, lm in zip(entry[0], lms)):
                self._entries.move_to_end(key)
                return entry[1]
        value = self.build(lms)
        try:
            refs = tuple(weakref.ref(lm) for lm in lms)
        except TypeError:  # a model object that takes no weak reference: not cached
            return value
        with self._lock:
            self._entries[key] = (refs, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
