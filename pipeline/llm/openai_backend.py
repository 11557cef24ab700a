"""The `openai` backend: any OpenAI-compatible chat-completions endpoint through the `openai`
package's async client, one request per call.

The SDK's own retries are off (`max_retries=0`): the project's policy (pipeline/llm/retry.py)
decides, so every SDK failure is translated here into an `EndpointError` saying whether a retry may
help. Retryable, as the SDK itself and OpenAI's guidance treat them: 408, 409, 429 and 5xx,
timeouts, dropped or reset connections, and answers that arrive broken (invalid JSON, no choices,
no content: a proxy that cut the body short, a 200 that carries an error), which a second attempt
may not meet. Other 4xx (bad request, wrong key, unknown model) fail at once: repeating them
cannot succeed.
"""

import asyncio
import email.utils
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from pipeline.config.llm import EndpointConfig
from pipeline.llm.cache import sampling_parameters
from pipeline.llm.chat import ChatRequest, Completion
from pipeline.llm.credentials import public_url, redact
from pipeline.llm.retry import EndpointError
from pipeline.llm.thinking_format import THINK_OPEN, render_thinking_output

RETRYABLE_STATUS = {408, 409, 429}

Send = Callable[[list[ChatRequest]], Awaitable[list[Completion]]]


def retry_after_s(headers: Any) -> float | None:
    """The server's requested wait: `retry-after-ms` (OpenAI), else `Retry-After` in seconds or as
    an HTTP date (RFC 9110 10.2.3). A value that is no wait (`inf`, `nan`, negative seconds, text)
    is no advice: the policy's backoff decides; a date already past means now. How long a wait the
    client honours is the policy's (pipeline/llm/retry.py caps it)."""
    if (millis := _delay_s(headers.get("retry-after-ms"))) is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    if (seconds := _delay_s(value)) is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError):  # neither seconds nor a date: no advice
        return None
    return max(0.0, when - time.time())


def _delay_s(value: str | None) -> float | None:
    """A header's number if it is a finite, non-negative one, else None."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


class OpenAIBackend:
    name = "openai"
    batch_size = 1  # the server batches (vLLM's continuous batching); we keep `concurrency` in flight

    def __init__(self, endpoint: EndpointConfig, api_key: str | None):
        self.endpoint = endpoint
        self.max_in_flight = endpoint.concurrency
        self._api_key = api_key
        self._tls: Any = None

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.endpoint.model!r})"

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Send]:
        """An SDK client for this event loop (an httpx pool must not outlive its loop)."""
        import openai

        if self._tls is None:
            import httpx2  # the openai package's HTTP client

            # Loading the CA bundle costs ~0.2 s per SDK client (measured): once per backend, so a
            # stage that calls `complete` once per small batch does not pay it every call.
            self._tls = httpx2.create_ssl_context()
        client = openai.AsyncOpenAI(
            base_url=self.endpoint.base_url,
            # Local servers (vLLM, SGLang, Ollama) take any key; the SDK insists on a non-empty one.
            api_key=self._api_key or "no-key",
            max_retries=0,
            timeout=self.endpoint.timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(verify=self._tls),
        )

        async def send(requests: list[ChatRequest]) -> list[Completion]:
            return [await self._complete(client, request) for request in requests]

        try:
            yield send
        finally:
            await client.close()

    def _arguments(self, request: ChatRequest) -> dict[str, Any]:
        if request.thinking_budget is not None:
            # A stage bug, not an endpoint failure: only the transformers backend can force a thinking budget.
            raise ValueError("the openai backend cannot force a thinking budget (ChatRequest.thinking_budget)")
        sampling = sampling_parameters(self.endpoint)
        arguments: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": [dict(message) for message in request.messages],
            "temperature": sampling["temperature"],
            "top_p": sampling["top_p"],
            # `max_tokens`, not `max_completion_tokens`: the one vLLM, SGLang and Ollama all accept.
            "max_tokens": sampling["max_tokens"],
        }
        if sampling["seed"] is not None:
            arguments["seed"] = sampling["seed"] + request.sample_index
        if request.response_format is not None:
            arguments["response_format"] = request.response_format
        return arguments

    async def _complete(self, client: Any, request: ChatRequest) -> Completion:
        """One chat completion. Sent with the client's generic `post` and parsed here rather than
        through `chat.completions.create`: the typed path transforms every parameter recursively
        and builds pydantic models of the response, about 1 ms of CPU per request (measured with
        bench/sampling.py's server), which at 32 in flight on two busy cores is a third of what
        the client can spend. Authentication, the status errors and the per-read timeout stay the
        SDK's; the whole attempt's deadline is this method's."""
        import openai

        try:
            # httpx's timeout (the SDK's) bounds each connect, write and read, not the request: a
            # server that sends its body a byte every half second meets every read in time, and
            # took 110 s under a 2 s timeout. This deadline bounds the whole attempt, connection to
            # last byte, as `timeout_s` promises; past it the attempt is a timeout, retried as a hung one.
            async with asyncio.timeout(self.endpoint.timeout_s):
                content = await client.post("/chat/completions", cast_to=bytes, body=self._arguments(request))
            body = json.loads(content)
        except (openai.APITimeoutError, TimeoutError):
            raise EndpointError("timeout", f"no answer within {self.endpoint.timeout_s:g} s", retryable=True) from None
        except openai.APIConnectionError as exc:
            cause = type(exc.__cause__).__name__ if exc.__cause__ else "connection lost"
            raise EndpointError(
                "connection", redact(f"{exc.message} ({cause})", self._api_key), retryable=True
            ) from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            detail = redact(exc.message, self._api_key)
            base_url = self.endpoint.base_url or ""
            if status == 404 and not base_url.rstrip("/").endswith("/v1"):
                # Found by probing: `http://host:8000` for vLLM answered 404 "no route /chat/completions", named no
                # field, and the field's own description says "up to /v1".
                detail += f" (the endpoint's base_url {public_url(base_url)} has no /v1: OpenAI-compatible servers serve /v1/chat/completions)"
            raise EndpointError(
                f"http {status}",
                detail,
                retryable=status in RETRYABLE_STATUS or status >= 500,
                retry_after_s=retry_after_s(exc.response.headers),
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EndpointError("malformed response", f"the body is not JSON ({exc})", retryable=True) from None
        return completion_of(body)


def _reasoning_of(message: Any) -> str | None:
    """The thinking a reasoning parser returned beside the content: `reasoning_content` (vLLM before
    0.10, DeepSeek, SGLang) or `reasoning` (vLLM since), when it holds any text."""
    if not isinstance(message, dict):
        return None
    for field in ("reasoning_content", "reasoning"):
        value = message.get(field)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def completion_of(body: Any) -> Completion:
    """The first choice's text and the usage of a chat-completions response body."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list):
        raise EndpointError("malformed response", "the body has no `choices` list", retryable=True)
    if not choices:
        raise EndpointError("empty choices", "the response has no choices", retryable=True)
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    reasoning = _reasoning_of(message)
    if content is None and reasoning is not None:
        content = ""  # a reasoning model that wrote only its thinking (an empty observation is an answer)
    if not isinstance(content, str):
        raise EndpointError("empty choices", "the first choice has no text content", retryable=True)
    if reasoning is not None and THINK_OPEN not in content:
        # A server run with a reasoning parser (vLLM's --reasoning-parser, SGLang, DeepSeek's API) moves
        # the thinking out of `content` (issue 17.9): put it back in the thinking format every parser
        # of this project reads, so the thinking is neither lost nor counted as part of the observation.
        content = render_thinking_output(reasoning, content)
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return Completion(
        text=content,
        prompt_tokens=_token_count(usage.get("prompt_tokens")),
        completion_tokens=_token_count(usage.get("completion_tokens")),
    )


# The cache's token columns are INTEGER (32-bit, pipeline/store/migrations.py): a count past it could
# not be stored, and no answer runs to two billion tokens.
_MAX_TOKEN_COUNT = 2**31 - 1


def _token_count(value: Any) -> int | None:
    """A reported token count if it is one (an int, not a bool, 0 to `_MAX_TOKEN_COUNT`), else None,
    as if the server reported no usage. The body is untrusted: `"many"` or 10**30 in the cache's
    INTEGER column failed the whole group commit, and every rerun the same way; -5, 1.5 or `true`
    are no counts either. The answer itself is usable and the counts only informative (the tally,
    the progress line), so only the count is dropped."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_TOKEN_COUNT:
        return value
    return None
