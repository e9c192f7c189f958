"""Bounded memory of recent entries: the idiom of every cache keyed by layout, so that endless new
sizes keep it flat."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TypeVar

V = TypeVar("V")


def remember(recent: OrderedDict[Hashable, V], key: Hashable, value: V, limit: int) -> V:
    """Put ``value`` under ``key`` as the most recent entry of ``recent`` (oldest first); past
    ``limit`` entries, forget the oldest. Returns ``value``."""
    recent.pop(key, None)
    recent[key] = value
    if len(recent) > limit:
        recent.popitem(last=False)
    return value
