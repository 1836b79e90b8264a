"""Sample-to-insert ratio rate limiter (Reverb's ``SampleToInsertRatio``).

Keeps the learner's sampling and the actors' inserting at a target ratio
``samples_per_insert`` (SPI), blocking whichever side runs ahead.

The rule (as in deepmind/reverb ``rate_limiters.py`` + ``cc/rate_limiter.cc``)
works on two counters, ``inserts`` and ``samples``, and the "error"::

    diff = inserts * samples_per_insert - samples

* ``error_buffer`` as a number ``b``: ``offset = samples_per_insert * min_size_to_sample``,
  ``min_diff = offset - b``, ``max_diff = offset + b``.  The offset makes the
  error count only the operations after the first ``min_size_to_sample``
  inserts (those are inserted without any sample).
* ``error_buffer`` as a pair: ``(min_diff, max_diff)`` used as given.

* ``can_insert(n)``: True while ``inserts + n <= min_size_to_sample`` (the
  replay is still filling), else ``(inserts + n) * SPI - samples <= max_diff``.
* ``can_sample(n)``: False while ``inserts < min_size_to_sample``, else
  ``inserts * SPI - samples - n >= min_diff``.

Reverb counts ``inserts - deletes`` for the size test; here the replay is a
ring whose capacity is at least ``min_size_to_sample``, so once that many
items were inserted it never holds fewer, and ``inserts`` alone is used.

Construction checks (also Reverb's): ``min_size_to_sample >= 1``,
``max_diff - min_diff >= 2 * max(1, SPI)`` (a narrower window can block both
sides forever), ``min_diff <= SPI * min_size_to_sample`` (else sampling never
starts); a ``max_diff`` below ``SPI * min_size_to_sample`` only warns (it
deadlocks unless sampling runs concurrently with inserting).

The counting rule is the frozen dataclass :class:`RatioRule` over plain
counters (picklable, no locks), so a multiprocess limiter can reuse it with
shared counters; :class:`RateLimiter` adds the thread-safe counters and
blocking waits (one ``threading.Condition``; waiters sleep, never spin).
"""

from __future__ import annotations

import numbers
import threading
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class RatioRule:
    """Reverb's sample-to-insert rule over plain counters."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    @classmethod
    def from_error_buffer(
        cls, samples_per_insert: float, min_size_to_sample: int, error_buffer: float | tuple[float, float]
    ) -> "RatioRule":
        """Build and validate a rule the way Reverb's ``SampleToInsertRatio`` does."""
        spi = float(samples_per_insert)
        if not spi > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}.")
        if int(min_size_to_sample) < 1:
            raise ValueError(f"min_size_to_sample must be a positive integer, got {min_size_to_sample}.")
        min_size = int(min_size_to_sample)
        if isinstance(error_buffer, numbers.Real):
            offset = spi * min_size
            min_diff, max_diff = offset - float(error_buffer), offset + float(error_buffer)
        else:
            try:
                min_diff, max_diff = (float(x) for x in error_buffer)
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"error_buffer must be a number or a (min_diff, max_diff) pair, got {error_buffer!r}."
                ) from err
        if max_diff - min_diff < 2 * max(1.0, spi):
            raise ValueError(
                f"error_buffer window [{min_diff}, {max_diff}] is narrower than 2 * max(1, samples_per_insert) = "
                f"{2 * max(1.0, spi)}; it could block both inserts and samples forever. Use error_buffer >= "
                f"max(1, samples_per_insert)."
            )
        if min_diff > spi * min_size:
            raise ValueError(
                f"error_buffer min_diff {min_diff} is above samples_per_insert * min_size_to_sample = {spi * min_size}; "
                "sampling would never be allowed. Lower min_diff."
            )
        if max_diff < spi * min_size:
            warnings.warn(
                f"error_buffer max_diff {max_diff} is below samples_per_insert * min_size_to_sample = {spi * min_size}: "
                "inserting blocks before the replay reaches min_size_to_sample, a deadlock unless sampling runs "
                "concurrently.",
                stacklevel=3,
            )
        return cls(spi, min_size, min_diff, max_diff)

    def can_insert(self, inserts: int, samples: int, n: int = 1) -> bool:
        """Whether ``n`` more inserts are allowed after ``inserts``/``samples``."""
        if inserts + n <= self.min_size_to_sample:
            return True
        return (inserts + n) * self.samples_per_insert - samples <= self.max_diff

    def can_sample(self, inserts: int, samples: int, n: int = 1) -> bool:
        """Whether ``n`` more samples are allowed after ``inserts``/``samples``."""
        if inserts < self.min_size_to_sample:
            return False
        return inserts * self.samples_per_insert - samples - n >= self.min_diff


class RateLimiter:
    """Thread-safe sample-to-insert ratio limiter with blocking waits.

    Args:
        samples_per_insert: target samples per inserted item (> 0).
        min_size_to_sample: inserts needed before any sample (>= 1).
        error_buffer: allowed deviation, a number or a ``(min_diff, max_diff)`` pair.

    Typical use: the actor calls ``await_can_insert(k)`` then ``insert(k)``;
    the learner calls ``await_can_sample(1)`` then ``sample(1)`` per batch
    (count a batch as one sample and set SPI per batch, or count items).
    With several threads on one side, pair each await with its record
    under the caller's own lock, as the check and the record are separate.
    """

    def __init__(
        self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float | tuple[float, float]
    ) -> None:
        self.rule = RatioRule.from_error_buffer(samples_per_insert, min_size_to_sample, error_buffer)
        self.inserts = 0
        self.samples = 0
        self.closed = False
        self._cond = threading.Condition()

    @property
    def samples_per_insert(self) -> float:
        return self.rule.samples_per_insert

    @property
    def min_size_to_sample(self) -> int:
        return self.rule.min_size_to_sample

    def can_insert(self, n: int = 1) -> bool:
        return self.rule.can_insert(self.inserts, self.samples, n)

    def can_sample(self, n: int = 1) -> bool:
        return self.rule.can_sample(self.inserts, self.samples, n)

    def insert(self, n: int = 1) -> None:
        """Record ``n`` inserts and wake waiters."""
        with self._cond:
            self.inserts += n
            self._cond.notify_all()

    def sample(self, n: int = 1) -> None:
        """Record ``n`` samples and wake waiters."""
        with self._cond:
            self.samples += n
            self._cond.notify_all()

    def await_can_insert(self, n: int = 1, timeout: float | None = None) -> bool:
        """Block until ``n`` inserts are allowed; False on timeout or after ``close()``."""
        return self._await(lambda: self.rule.can_insert(self.inserts, self.samples, n), timeout)

    def await_can_sample(self, n: int = 1, timeout: float | None = None) -> bool:
        """Block until ``n`` samples are allowed; False on timeout or after ``close()``."""
        return self._await(lambda: self.rule.can_sample(self.inserts, self.samples, n), timeout)

    def _await(self, allowed, timeout: float | None) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self.closed or allowed(), timeout)
            return not self.closed and allowed()

    def close(self) -> None:
        """Wake every waiter; current and later awaits return False."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def state_dict(self) -> dict:
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        with self._cond:
            self.inserts = int(state["inserts"])
            self.samples = int(state["samples"])
            self._cond.notify_all()

    def __repr__(self) -> str:
        r = self.rule
        return (
            f"RateLimiter(samples_per_insert={r.samples_per_insert}, min_size_to_sample={r.min_size_to_sample}, "
            f"min_diff={r.min_diff}, max_diff={r.max_diff}, inserts={self.inserts}, samples={self.samples})"
        )
