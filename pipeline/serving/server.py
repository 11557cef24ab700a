"""`simulacra serve`: an OpenAI-compatible HTTP server that acts as the environment (issues 12, 19).

`POST /v1/chat/completions` takes the trajectory so far and the action (as chat messages or as
structured fields, pipeline/serving/protocol.py) and answers the simulated observation as the
assistant message's `content`, streamed as server-sent events with `stream: true`. The answer format
is the request's `chat_template_kwargs.enable_thinking` (vLLM's field, Qwen3's switch: issue 28), else
the one the model was trained in; it chooses the instruction of a system prompt the server renders (from
parts or structured fields) and how the answer is read: thinking, the thinking goes to
`reasoning_content` (vLLM's reasoning-parser convention) and stays out of `content` unless
`include_thinking` is true; direct, the whole answer is `content`. A format the model was not trained
in is a 400 naming those it was. `GET /v1/models` and `GET /v1/models/{id}` describe the model (context
length, prompt format, answer formats); `GET /health` says it is up, with the decoder's load.

A credential in an answer (a key the model recites from the history it was sent or from its training data) is
replaced by `[redacted-secret]`, streamed or not, in `content`, `reasoning_content` and logprobs' tokens
(pipeline/serving/answer_redaction.py): an answer is an agent's observation, and so its training sample.

Requests are decoded together (pipeline/llm/batching.py). A request whose client goes away
(a closed stream, a timed-out client) is cancelled and leaves the batch at the next token.

Bad requests get a 4xx in OpenAI's error shape (`{"error": {"message", "type", "param", "code"}}`),
never a 500: a body over the size limit (413, refused from its Content-Length before it is read, or
as soon as a chunked body passes the limit), a body that is not JSON or holds a lone surrogate, an
unknown field (named), a missing action, a model name that is not served (404), a prompt that with
its token budget exceeds the context length (counted in tokens). A 500, still in that shape, means
the server itself failed. Parsing, validation and tokenisation run off the event loop, so a large
body never stalls `/health` or other clients.
"""

import asyncio
import json
import time
import uuid
from typing import Any

from pydantic_core import ErrorDetails

from pipeline.llm.batching import DRAFT_TOKENS, Row, Sampling, Scheduler, Step, TokenLogprob
from pipeline.llm.credentials import redact
from pipeline.serving.answer_redaction import SettledText, SettledTokens, redacted_tokens
from pipeline.serving.prompt_formats import SYSTEM_PART_NAMES, UntrainedAnswerFormat, world_model_messages
from pipeline.serving.protocol import ChatCompletionRequest
from pipeline.serving.streaming import AnswerStream
from pipeline.serving.thinking import split_thinking
from pipeline.serving.token_bytes import token_bytes
from pipeline.store.schema import DOMAINS, SystemPrompt

STREAM_END = "data: [DONE]\n\n"  # a streamed answer's last event, whatever came before it


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(status: int, message: str, param: str | None = None, code: str | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(_error_body(status, message, param, code), status_code=status)


def _validation_message(error: ErrorDetails) -> tuple[str, str | None]:
    field = ".".join(str(part) for part in error["loc"]) or None
    if error["type"] == "extra_forbidden":
        return f"unknown field `{field}`", field
    if error["type"] == "missing":
        return f"field `{field}` is required", field
    message = error["msg"].removeprefix("Value error, ")
    return (f"field `{field}`: {message}" if field else message), field


def _is_part(message) -> bool:
    return message.world_model_role() == "system" and message.name in SYSTEM_PART_NAMES


def _system_from_parts(model, request: ChatCompletionRequest, parts: dict[str, str], thinking: bool) -> dict[str, str]:
    """The system message the part messages and `tools` stand for, rendered in the model's template and
    asking for the answer format `thinking` says."""
    if "domain" not in parts:
        raise RequestError(400, "system-prompt parts without a `domain` part", "messages")
    if parts["domain"] not in DOMAINS:  # as the structured form's `domain` is checked
        raise RequestError(
            400, f"unknown domain {parts['domain']!r} in the `domain` part: one of {', '.join(DOMAINS)}", "messages"
        )
    tools = request.tools if isinstance(request.tools, list) else []
    # As the structured form's `system.tools` is checked: a string or a number rendered into the prompt as a tool
    # is a prompt the model never trained on (found by probing).
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(400, f"tools[{index}] is {json.dumps(tool)}: each tool is an object", f"tools.{index}")
    system = SystemPrompt(
        task_description=parts.get("task_description", ""),
        action_space=parts.get("action_space"),
        tools=tools,
        initial_state=parts.get("initial_state"),
        demonstrations=parts.get("demonstrations"),
        simulation_instructions=parts.get("simulation_instructions"),
    )
    return {"role": "system", "content": model.format.render_system(parts["domain"], system, thinking)}


def _messages(model, request: ChatCompletionRequest, thinking: bool) -> list[dict[str, str]]:
    if request.messages is not None:
        messages: list[dict[str, str]] = []
        parts: dict[str, str] = {}
        for index, message in enumerate(request.messages):
            try:
                text = message.text()
            except ValueError as exc:
                raise RequestError(
                    400, f"field `messages.{index}.content`: {exc}", f"messages.{index}.content"
                ) from None
            if _is_part(message):
                parts[message.name] = text  # type: ignore[index]  # a part message is named (_is_part)
                continue
            messages.append({"role": message.world_model_role(), "content": text})
        if parts:
            # First, wherever the parts came: the chat template renders the system prompt first, and a system
            # or user message sent before the parts then follows it (vLLM's prompt and this one must agree).
            messages.insert(0, _system_from_parts(model, request, parts, thinking))
        return messages
    system = request.system.prompt() if request.system is not None else SystemPrompt()
    turns = [(turn.action, turn.observation) for turn in request.turns]
    # The request's validator (_one_way_to_ask) requires domain and action when there are no messages.
    assert request.domain is not None and request.action is not None
    return world_model_messages(
        model.format, request.domain, system, turns, request.action, request.control_instructions, thinking
    )


class Prepared:
    """A validated request: its prompt tokens, each choice's sampling and the answer format (True: thinking)."""

    def __init__(self, request: ChatCompletionRequest, prompt: list[int], sampling: Sampling, thinking: bool):
        self.request, self.prompt, self.sampling, self.thinking = request, prompt, sampling, thinking


def prepare(model, body: bytes, default_max_tokens: int) -> Prepared:
    """Parse, validate and tokenise one request body (in a worker thread); RequestError when it is bad."""
    from pydantic import ValidationError

    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "the request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "the request body must be a JSON object")
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(
            400,
            f"the request holds a lone surrogate ({exc.object[exc.start : exc.end]!a}), which is no "
            "Unicode text: encode the text as UTF-8 before sending it",
        ) from None
    try:
        request = ChatCompletionRequest.model_validate(payload)
    except ValidationError as exc:
        message, param = _validation_message(exc.errors()[0])
        raise RequestError(400, message, param) from None
    if request.model is not None and request.model != model.name:
        raise RequestError(
            404,
            f"model `{request.model}` is not served here; this server serves `{model.name}`",
            "model",
            "model_not_found",
        )
    vocabulary = model.model.config.vocab_size
    outside = [token for token in request.logit_bias or {} if not 0 <= token < vocabulary]
    if outside:  # vLLM's answer too: a bias on no token would silently change nothing (found by probing)
        raise RequestError(
            400,
            f"logit_bias names token id(s) outside the vocabulary (0 to {vocabulary - 1}): {outside[:5]}",
            "logit_bias",
        )
    try:
        thinking = model.format.answer_mode(request.enable_thinking())
    except UntrainedAnswerFormat as exc:
        raise RequestError(400, str(exc), "chat_template_kwargs.enable_thinking") from None
    prompt = model.prompt_ids(_messages(model, request, thinking))
    room = model.context_length - len(prompt)
    budget = request.token_limit() or min(default_max_tokens, room)
    if room < 1:  # said apart: with no max_tokens the budget is what is left, and "may take -3500 more" said nothing
        raise RequestError(
            400,
            f"the prompt is {len(prompt)} tokens, which leaves no room for an answer in the model's context length "
            f"of {model.context_length} tokens: send fewer history turns or a shorter action",
            "messages",
            "context_length_exceeded",
        )
    if budget > room:
        raise RequestError(
            400,
            f"the prompt is {len(prompt)} tokens and the answer may take {budget} more, past the model's context "
            f"length of {model.context_length} tokens: send fewer history turns or a smaller max_tokens",
            "messages",
            "context_length_exceeded",
        )
    sampling = Sampling(
        max_tokens=budget,
        temperature=request.sampling_temperature(),
        top_p=request.top_p if request.top_p is not None else 1.0,
        seed=request.seed,
        stop=tuple(request.stop_sequences()),
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        logit_bias=tuple((request.logit_bias or {}).items()),
        logprobs=request.logprobs,
        top_logprobs=request.top_logprobs or 0,
        ignore_eos=request.ignore_eos,
    )
    return Prepared(request, prompt, sampling, thinking)


def _logprob_entry(model, token: TokenLogprob, replacement: str | None = None) -> dict[str, Any]:
    """A token's logprob entry; with a `replacement` (the token is part of a credential), that text and no
    alternatives (pipeline/serving/answer_redaction.py)."""

    def described(token_id: int, logprob: float, text: str | None = None) -> dict[str, Any]:
        if text is not None:  # a replacement: its own text, nothing of the token's
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", errors="replace"))}
        text = model.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(token_bytes(model.tokenizer, token_id, text))}

    entry = described(token.token_id, token.logprob, replacement)
    entry["top_logprobs"] = [] if replacement is not None else [described(i, value) for i, value in token.top]
    return entry


def build_app(
    model,
    default_max_tokens: int,
    max_batch: int = 32,
    max_body_bytes: int = 4 << 20,
    draft_tokens: int = DRAFT_TOKENS,
    kv_cache_gib: float | None = None,
):
    """The FastAPI application over a loaded `WorldModel`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="Simulacra world model", docs_url=None, redoc_url=None, openapi_url=None)
    scheduler = Scheduler(
        model.model,
        model.tokenizer,
        model.stop_token_ids,
        max_batch,
        draft_tokens=draft_tokens,
        kv_cache_gib=kv_cache_gib,
    )
    app.state.scheduler = scheduler
    fingerprint = f"simulacra-{model.metadata.get('fingerprint', 'unknown')}"

    @app.exception_handler(HTTPException)  # an unknown path or method, in OpenAI's error shape
    async def http_error(request: Request, exc: HTTPException):
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)  # a failure of the server itself, still in OpenAI's shape
    async def server_error(request: Request, exc: Exception):
        return _error(500, f"the server failed: {type(exc).__name__}: {exc}")

    def model_entry() -> dict[str, Any]:
        return {
            "id": model.name,
            "object": "model",
            "created": int(model.model_dir.stat().st_mtime),
            "owned_by": "simulacra",
            "max_model_len": model.context_length,
            "simulacra": {
                "prompt_format": model.format.name,
                "thinking": model.format.thinking,
                "answer_formats": list(model.format.answer_formats),
                "max_history_chars": model.metadata.get("max_history_chars"),
            },
        }

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": model.name,
            "running": scheduler.running,
            "waiting": scheduler.waiting,
            "largest_batch": scheduler.largest_batch,
            "cancelled": scheduler.cancelled,
        }

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry()]}

    @app.get("/v1/models/{model_id:path}")
    def one_model(model_id: str):
        if model_id != model.name:
            return _error(
                404,
                f"model `{model_id}` is not served here; this server serves `{model.name}`",
                "model",
                "model_not_found",
            )
        return model_entry()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            return _too_large(int(declared))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                return _too_large(len(body))
        try:
            prepared = await asyncio.to_thread(prepare, model, bytes(body), default_max_tokens)
        except RequestError as exc:
            return _error(exc.status, exc.message, exc.param, exc.code)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, Step]] = asyncio.Queue()
        rows = [
            Row(
                prepared.prompt,
                prepared.sampling,
                choice,
                lambda step, choice=choice: loop.call_soon_threadsafe(queue.put_nowait, (choice, step)),  # type: ignore[misc, arg-type]  # a default-bound lambda; its Handle unused
                streaming=prepared.request.stream,
            )
            for choice in range(prepared.request.n)
        ]
        scheduler.submit(rows)
        if prepared.request.stream:
            return StreamingResponse(_stream(prepared, rows, queue), media_type="text/event-stream")
        try:
            return await _answer(request, prepared, rows, queue)
        finally:
            for row in rows:  # a no-op for rows already finished; the rest leave the batch
                row.cancel()

    def _too_large(size: int):
        return _error(
            413,
            f"the request body is {size} bytes or more, over this server's limit of {max_body_bytes} "
            "(`simulacra serve --max-body-mb`): send fewer history turns",
            None,
            "request_too_large",
        )

    def _head(prepared: Prepared) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": model.name,
            "system_fingerprint": fingerprint,
        }

    def _usage(prepared: Prepared, completion_tokens: int) -> dict[str, int]:
        prompt_tokens = len(prepared.prompt)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    async def _answer(request: Request, prepared: Prepared, rows: list[Row], queue: asyncio.Queue):
        n = len(rows)
        finals: dict[int, Step] = {}
        getter = None
        while len(finals) < n:
            # One pending get, waited on with a timeout but never cancelled, so no step is lost to a timeout.
            getter = getter or asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter}, timeout=0.5)
            if not done:
                if await request.is_disconnected():  # the client gave up: stop generating for it
                    getter.cancel()
                    return Response(status_code=499)
                continue
            choice, step = getter.result()
            getter = None
            if step.finish_reason is not None:
                finals[choice] = step
        failed = next((step for step in finals.values() if step.finish_reason == "error"), None)
        if failed is not None:
            return _error(500, f"generation failed: {failed.error}")
        choices = []
        for index in range(n):
            step = finals[index]
            text = redact(step.text)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if prepared.thinking:  # a direct answer is all observation: nothing in it is split off
                thinking, observation = split_thinking(text)
                message["reasoning_content"] = thinking
                if not prepared.request.include_thinking:
                    message["content"] = observation
            tokens = [(token, model.token_text(token.token_id)) for token in rows[index].logprobs]
            logprobs = [_logprob_entry(model, token, shown) for token, shown in redacted_tokens(tokens)]
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "finish_reason": step.finish_reason,
                    "logprobs": {"content": logprobs} if prepared.request.logprobs else None,
                }
            )
        return {
            **_head(prepared),
            "object": "chat.completion",
            "choices": choices,
            "usage": _usage(prepared, sum(step.completion_tokens for step in finals.values())),
        }

    async def _stream(prepared: Prepared, rows: list[Row], queue: asyncio.Queue):
        head = {**_head(prepared), "object": "chat.completion.chunk"}

        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs=None) -> str:
            choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            return event({**head, "choices": [choice]})

        try:
            n = len(rows)
            streams = [AnswerStream(prepared.thinking, prepared.request.include_thinking) for _ in range(n)]
            texts = [SettledText() for _ in range(n)]
            tokens = [SettledTokens() for _ in range(n)]
            for index in range(n):
                yield chunk(index, {"role": "assistant", "content": ""})
            finished, completion_tokens = 0, 0
            while finished < n:
                index, step = await queue.get()
                if step.finish_reason == "error":
                    yield event(_error_body(500, f"generation failed: {step.error}"))
                    yield STREAM_END  # after its error too, as vLLM's server ends it
                    return
                final = step.finish_reason is not None
                # Shown as far as no later token can change its redaction; the rest waits for the next steps.
                reasoning, content = streams[index].deltas(texts[index].advance(step.text, final), final)
                delta: dict[str, Any] = {}
                if reasoning:
                    delta["reasoning_content"] = reasoning
                if content:
                    delta["content"] = content
                if step.logprob is not None:
                    tokens[index].add(step.logprob, model.token_text(step.logprob.token_id))
                released = [_logprob_entry(model, token, shown) for token, shown in tokens[index].release(final)]
                logprobs = {"content": released} if released else None
                if delta or logprobs or final:
                    yield chunk(index, delta, step.finish_reason, logprobs)
                if final:
                    finished += 1
                    completion_tokens += step.completion_tokens
            options = prepared.request.stream_options
            if options is not None and options.include_usage:
                yield event({**head, "choices": [], "usage": _usage(prepared, completion_tokens)})
            yield STREAM_END
        finally:  # the client closed the stream, or it ended: rows still decoding leave the batch
            for row in rows:
                row.cancel()

    return app


def serve(
    model_dir,
    host: str,
    port: int,
    device: str,
    default_max_tokens: int,
    max_batch: int,
    max_body_bytes: int,
    draft_tokens: int = DRAFT_TOKENS,
    kv_cache_gib: float | None = None,
) -> None:
    import uvicorn

    from pipeline.serving.listening import bound_port, listening_socket
    from pipeline.serving.world_model import WorldModel

    sock = listening_socket(host, port)  # before the model loads: a port in use is refused at once
    port = bound_port(sock)  # --port 0: the one the system picked, in the line below (local_server.py reads it)
    model = WorldModel(model_dir, device)
    print(
        f"serving {model.name} ({model.format.name} format, answering {'/'.join(model.format.answer_formats)}, "
        f"context {model.context_length}) at http://{host}:{port}/v1",
        flush=True,
    )
    app = build_app(model, default_max_tokens, max_batch, max_body_bytes, draft_tokens, kv_cache_gib)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run(sockets=[sock])
