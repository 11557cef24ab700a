"""Counts of what a client did: the progress bar's line, the stage's metrics, the failure check."""

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RequestTally:
    requests: int = 0  # distinct requests asked (identical ones in a call are asked once)
    done: int = 0  # answered by the endpoint in this run
    cached: int = 0  # answered from the store, no request sent
    failed: int = 0  # failed after their retries
    retries: int = 0  # attempts beyond each request's first
    prompt_tokens: int = 0  # as reported by the endpoint, fresh answers only
    completion_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # final failures by kind
    examples: dict[str, str] = field(default_factory=dict)  # the first failure's detail per kind (redacted)

    @property
    def failed_fraction(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    def commonest_error(self) -> tuple[str, int] | None:
        return self.errors.most_common(1)[0] if self.errors else None

    def line(self) -> str:
        """The progress bar's status; tokens only once the endpoint has reported usage."""
        counts = f"{self.done} done, {self.cached} cached, {self.failed} failed"
        if self.prompt_tokens or self.completion_tokens:
            counts += f", {self.prompt_tokens} tokens in, {self.completion_tokens} out"
        return counts
