"""A real OpenAI-protocol HTTP server on 127.0.0.1 for tests and benchmarks: scripted answers, a
request log, and injected faults.

    with OpenAIServer(answer=lambda request: "ok") as server:
        server.faults.extend([Fault("rate_limit", retry_after=1), Fault("reset")])
        ... EndpointConfig(backend="openai", base_url=server.base_url, model=server.model) ...
        server.log  # every request: its body, Authorization header, outcome and timestamps

Faults are consumed one per request, in order, before the scripted answer; requests find the queue
empty once it is spent. Run as a script (`python tests/openai_server.py --latency 0.2`) it serves in
its own process, so a benchmark's client does not share a GIL with it, and prints its base URL.
"""

import argparse
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

FaultKind = Literal[
    "rate_limit",
    "server_error",
    "unavailable",
    "hang",
    "reset",
    "truncated",
    "empty_choices",
    "answer",
    "unauthorized",
    "unauthorized_masked",
    "unauthorized_reversed",
]


@dataclass(frozen=True)
class Fault:
    """One injected misbehaviour. `answer` replaces the scripted text with `text` (e.g. a judge score
    out of range); `rate_limit` sends `Retry-After: retry_after` with its 429; `unauthorized` is a 401
    whose message quotes the Authorization header it got, as careless servers do (the client must
    keep the key out of what it records all the same); `unauthorized_masked` quotes it masked, as
    OpenAI does (`sk-canar****...2ad4`: its first 8 characters and last 4); `unauthorized_reversed`
    quotes it backwards, a disguise."""

    kind: FaultKind
    retry_after: float | None = None
    text: str | None = None


@dataclass
class LoggedRequest:
    body: dict[str, Any]
    authorization: str | None
    started: float
    outcome: str = "pending"  # "answered", or the fault's kind
    answer: str | None = None
    finished: float | None = None


def echo_last_user_message(request: dict[str, Any]) -> str:
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    return f"echo: {users[-1] if users else ''}"


@dataclass
class OpenAIServer:
    answer: Callable[[dict[str, Any]], str] = echo_last_user_message
    latency_s: float = 0.0
    model: str = "test-model"
    hang_s: float = 30.0  # how long a `hang` holds the connection before closing it (tests set a short timeout)
    faults: deque[Fault] = field(default_factory=deque)
    log: list[LoggedRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = _Listener(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def answered(self) -> list[LoggedRequest]:
        with self._lock:
            return [entry for entry in self.log if entry.outcome == "answered"]

    def __enter__(self) -> "OpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _next_fault(self) -> Fault | None:
        with self._lock:
            return self.faults.popleft() if self.faults else None

    def _record(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.log.append(entry)

    def _completion(self, request: dict[str, Any], text: str) -> dict[str, Any]:
        prompt_words = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
        return {
            "id": f"chatcmpl-{len(self.log)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            # Words stand in for tokens: deterministic, and enough to check that usage is tallied.
            "usage": {
                "prompt_tokens": prompt_words,
                "completion_tokens": len(text.split()),
                "total_tokens": prompt_words + len(text.split()),
            },
        }


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    # http.server's default backlog of 5 drops the SYNs of a burst of new connections (32 clients
    # connecting at once), which the client then sees as timeouts; real servers listen with ~128+.
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that goes away mid-request (a timeout, a killed process) is routine here."""


def _handler_for(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers: the client's pool reuses connections

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the request log is `server.log`."""

        def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            self._send_json(
                200, {"object": "list", "data": [{"id": server.model, "object": "model", "owned_by": "test"}]}
            )

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            if len(raw) < length:  # the client went away mid-request (a killed worker): nothing to answer
                self.close_connection = True
                return
            request = json.loads(raw or b"{}")
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            entry = LoggedRequest(body=request, authorization=self.headers.get("Authorization"), started=time.time())
            server._record(entry)
            if server.latency_s:
                time.sleep(server.latency_s)
            fault = server._next_fault()
            if fault is not None and fault.kind != "answer":
                entry.outcome = fault.kind
            if fault is None or fault.kind == "answer":
                entry.answer = fault.text if fault else server.answer(request)
                # Only once there is an answer: a request the answer function refused stays "pending".
                entry.outcome = fault.kind if fault else "answered"
                self._send_json(200, server._completion(request, entry.answer))
            elif fault.kind == "rate_limit":
                retry_after = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
                self._send_json(429, {"error": {"message": "Rate limit reached", "type": "rate_limit"}}, retry_after)
            elif fault.kind in ("server_error", "unavailable"):
                status = 500 if fault.kind == "server_error" else 503
                self._send_json(status, {"error": {"message": f"injected {fault.kind}", "type": "server_error"}})
            elif fault.kind in ("unauthorized", "unauthorized_masked", "unauthorized_reversed"):
                key = (entry.authorization or "").removeprefix("Bearer ")
                shown = {
                    "unauthorized": entry.authorization,
                    "unauthorized_masked": f"{key[:8]}****...{key[-4:]}",
                    "unauthorized_reversed": key[::-1],
                }[fault.kind]
                quoted = f"Incorrect API key provided: {shown}"
                self._send_json(401, {"error": {"message": quoted, "type": "invalid_request_error"}})
            elif fault.kind == "hang":
                server._closing.wait(server.hang_s)
                self.close_connection = True
            elif fault.kind == "reset":
                # SO_LINGER 0 makes close() send RST: the client sees the connection reset, no response.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
            elif fault.kind == "truncated":
                whole = json.dumps(server._completion(request, server.answer(request))).encode()
                self._send_json(200, whole[: len(whole) // 2])
            elif fault.kind == "empty_choices":
                self._send_json(200, {**server._completion(request, ""), "choices": []})
            entry.finished = time.time()

        def finish(self) -> None:
            try:
                super().finish()
            except OSError:  # the `reset` fault closed the socket under the handler
                pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()
    with OpenAIServer(latency_s=args.latency) as server:
        print(server.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
