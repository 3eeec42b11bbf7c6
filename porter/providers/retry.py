"""Retries for provider calls, done here (the SDKs' own retries are set to 0).

What is retried is decided by the provider, which turns every SDK exception
into one of three outcomes before it reaches `call_with_retries`:

  - `Retryable(reason, retry_after, usage)`: 429, 5xx (incl. 529 overloaded),
    connection errors, timeouts, an error event in the middle of a stream;
  - `Fatal(message, usage)`: bad credentials (401/403), other 4xx, malformed
    responses: raised at once as a one-line ProviderError, never retried;
  - a value: the call succeeded.

Waits grow exponentially from `base_s` by `factor`, capped at `cap_s`, with
+-`jitter`/2 random spread (so many runs hitting one server desynchronise).
A server's Retry-After (seconds or an HTTP date, or retry-after-ms) replaces
the computed wait, capped at `retry_after_cap_s`.  Sleep and randomness are
injected so tests can assert every wait without waiting.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

T = TypeVar("T")


@dataclass
class RetryPolicy:
    max_attempts: int = 6  # total tries, the first included
    base_s: float = 2.0
    factor: float = 2.0
    cap_s: float = 60.0
    jitter: float = 0.5  # relative spread: wait * (1 - jitter/2 + jitter * U[0,1))
    retry_after_cap_s: float = 300.0

    def backoff(self, retry_index: int, rng: random.Random) -> float:
        """Wait before retry number `retry_index` (0 = the first retry), without Retry-After."""
        wait = min(self.cap_s, self.base_s * self.factor**retry_index)
        if self.jitter:
            wait *= 1.0 - self.jitter / 2 + self.jitter * rng.random()
        return max(0.0, min(self.cap_s, wait))

    @classmethod
    def from_options(cls, options: dict) -> "RetryPolicy":
        p = cls()
        for key, attr in (("max_attempts", "max_attempts"), ("retry_base_s", "base_s"), ("retry_cap_s", "cap_s"),
                          ("retry_jitter", "jitter"), ("retry_after_cap_s", "retry_after_cap_s")):
            if options.get(key) is not None:
                setattr(p, attr, type(getattr(p, attr))(options[key]))
        p.max_attempts = max(1, p.max_attempts)
        return p


class Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, usage: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.usage = usage or {}


class Fatal(Exception):
    def __init__(self, message: str, usage: dict | None = None):
        super().__init__(message)
        self.message = message
        self.usage = usage or {}


class GaveUp(Exception):
    """Every attempt failed with a retryable error."""

    def __init__(self, last: Retryable, attempts: int, waited_s: float):
        super().__init__(f"{last.reason} (gave up after {attempts} attempts, {waited_s:.0f}s of waiting)")
        self.last = last
        self.attempts = attempts
        self.waited_s = waited_s


@dataclass
class RetryLog:
    """What happened across the attempts of one call (for tests and the run log)."""

    attempts: int = 0
    waits: list[float] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def parse_retry_after(headers, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After / retry-after-ms header, or None."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def call_with_retries(
    attempt: Callable[[int], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    on_usage: Callable[[dict], None] | None = None,
    on_retry: Callable[[int, float, str], None] | None = None,
    log: RetryLog | None = None,
) -> T:
    """Run `attempt(n)` (n = 0, 1, ...) until it returns, raises Fatal, or
    max_attempts retryable failures have happened (then GaveUp).

    `on_usage` sees the usage of every failed attempt that reported some
    (a stream cut off after message_start, say) so none goes unrecorded.
    """
    rng = rng or random.Random()
    log = log if log is not None else RetryLog()
    waited = 0.0
    for n in range(policy.max_attempts):
        log.attempts = n + 1
        try:
            return attempt(n)
        except Retryable as exc:
            if exc.usage and on_usage:
                on_usage(exc.usage)
            log.reasons.append(exc.reason)
            if n + 1 >= policy.max_attempts:
                raise GaveUp(exc, n + 1, waited) from None
            if exc.retry_after is not None:
                wait = min(policy.retry_after_cap_s, exc.retry_after)
            else:
                wait = policy.backoff(n, rng)
            log.waits.append(wait)
            if on_retry:
                on_retry(n + 1, wait, exc.reason)
            waited += wait
            sleep(wait)
        except Fatal as exc:
            if exc.usage and on_usage:
                on_usage(exc.usage)
            raise
    raise AssertionError("unreachable")  # pragma: no cover
