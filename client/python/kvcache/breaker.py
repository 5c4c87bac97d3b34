"""CircuitBreaker: daemon trouble becomes a miss, without waiting on a dead daemon each call.

Shared by the engine integrations (kvcache.vllm, kvcache.llama_cpp): an engine must never
fail a request, or stall, because the cache is down.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional


class CircuitBreaker:
    """Turns daemon trouble into misses without waiting on a dead daemon each step.

    Closed: calls go through. After ``failure_threshold`` consecutive failures it opens:
    :meth:`allow` answers False (the connector reports a miss, skips saves) for
    ``cooldown_s``; then one trial call is let through (half-open): success closes it,
    failure re-opens it. Thread-safe; the clock is injectable for tests.
    """

    def __init__(self, failure_threshold: int = 3, cooldown_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1 or cooldown_s < 0:
            raise ValueError("CircuitBreaker: failure_threshold >= 1 and cooldown_s >= 0")
        self._threshold = failure_threshold
        self._cooldown = cooldown_s
        self._clock = clock
        self._mu = threading.Lock()
        self._failures = 0
        self._opened_at: Optional[float] = None
        self._trial_out = False
        self.trips = 0  #: times it opened

    @property
    def state(self) -> str:
        with self._mu:
            if self._opened_at is None:
                return "closed"
            if self._clock() - self._opened_at >= self._cooldown:
                return "half-open"
            return "open"

    def allow(self) -> bool:
        """Whether to call the daemon now (in half-open state: one trial at a time)."""
        with self._mu:
            if self._opened_at is None:
                return True
            if self._clock() - self._opened_at < self._cooldown or self._trial_out:
                return False
            self._trial_out = True
            return True

    def record_success(self) -> None:
        with self._mu:
            self._failures = 0
            self._opened_at = None
            self._trial_out = False

    def record_failure(self) -> None:
        with self._mu:
            self._failures += 1
            self._trial_out = False
            if self._opened_at is not None or self._failures >= self._threshold:
                if self._opened_at is None:
                    self.trips += 1
                self._opened_at = self._clock()
