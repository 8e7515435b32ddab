"""What every handler needs: configuration, the delivery queue, the records, GitHub, and per-PR locks."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gatekeeper.github.client import GitHubApp
from gatekeeper.github.config import AppConfig
from gatekeeper.github.pages import Pages
from gatekeeper.github.queue import DeliveryQueue
from gatekeeper.github.records import Records


class KeyedLocks:
    """One lock per key: two deliveries about the same PR never evaluate it at the same time, which would
    race to create two check runs for one head."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: defaultdict[tuple, threading.Lock] = defaultdict(threading.Lock)

    @contextmanager
    def hold(self, key: tuple) -> Iterator[None]:
        with self._guard:
            lock = self._locks[key]
        with lock:
            yield


@dataclass
class AppContext:
    config: AppConfig
    queue: DeliveryQueue
    records: Records  # on the queue's database
    github: GitHubApp
    pr_locks: KeyedLocks = field(default_factory=KeyedLocks)
    pages: Pages | None = None  # the details pages, on the records' database (made from it when not given)

    def __post_init__(self) -> None:
        if self.pages is None:
            self.pages = Pages(self.records.db)


@dataclass
class Progress:
    """How far a job got, so that a failure can still be reported on the right check run."""

    installation_id: int | None = None
    repo: str | None = None
    pr: int | None = None
    head_sha: str | None = None
    check_name: str | None = None
    check_run_id: int | None = None
    published: bool = False  # the verdict is on GitHub: a later failure may only add to it
