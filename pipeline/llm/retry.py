"""The retry policy: what is retryable, how long to wait, and the error a request ends with.

Backends translate their own exceptions into `EndpointError` (a kind, whether a retry may help, and
the server's Retry-After), so the policy is the project's, the same for every backend, and tested
against a real server (tests/test_llm_faults.py) rather than left to an SDK's defaults.
"""

import math
import random
from dataclasses import dataclass


class EndpointError(Exception):
    """One failed attempt. `kind` groups errors for the tally ("http 503", "timeout", "connection",
    "malformed response", "empty choices", "rejected answer", ...); `detail` never holds the API key."""

    def __init__(self, kind: str, detail: str, retryable: bool, retry_after_s: float | None = None):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.retryable = retryable
        self.retry_after_s = retry_after_s


# The longest server-requested wait the client honours, unless `backoff_max_s` allows longer. A
# request waits holding its concurrency slot, so a wait as long as any header says (`Retry-After:
# 100000` is 28 hours, `retry-after-ms: inf` forever) would stall the stage, silently. 60 s honours
# what rate limits ask in practice (OpenAI's are mostly per minute, so a 429's wait runs to a
# minute, and retrying sooner only meets another 429); a longer wait (a daily quota, a maintenance
# 503, a broken header) is cut to the cap: the retry that follows spends one of `max_retries`, and
# once they are spent the request is recorded as failed and the next run asks it again, as with
# any endpoint that stays down.
RETRY_AFTER_CAP_S = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int
    backoff_initial_s: float
    backoff_max_s: float

    @property
    def retry_after_cap_s(self) -> float:
        """The longest a server's Retry-After is honoured: `RETRY_AFTER_CAP_S`, or `backoff_max_s` where
        the user allows the backoff itself to wait longer."""
        return max(RETRY_AFTER_CAP_S, self.backoff_max_s)

    def cuts(self, retry_after_s: float | None) -> bool:
        """Whether the server asked for a longer wait than the client honours (`wait_s` cuts it)."""
        return retry_after_s is not None and math.isfinite(retry_after_s) and retry_after_s > self.retry_after_cap_s

    def wait_s(self, retry: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number `retry` (0 for the first).

        Without Retry-After: "full jitter" exponential backoff, uniform in [0, min(max, initial * 2^retry)]
        (the AWS Architecture Blog's "Exponential Backoff And Jitter", 2015): requests that failed
        together spread out instead of returning as one burst. With Retry-After: at least what the
        server asked, up to `retry_after_cap_s`, plus up to 10% so a burst told the same time does
        not return at once. A Retry-After that is no wait (infinite, NaN, negative: a backend passes
        on what it parsed) is no advice, and the backoff decides.
        """
        if retry_after_s is not None and math.isfinite(retry_after_s) and retry_after_s >= 0:
            return min(retry_after_s, self.retry_after_cap_s) * (1 + 0.1 * rng.random())
        return rng.uniform(0, min(self.backoff_max_s, self.backoff_initial_s * 2**retry))
