"""Runs the LLM client over N questions against an endpoint, as a stage would: a separate process
that tests/test_llm_resume.py can SIGKILL mid-way and run again.

    python tests/llm_client_worker.py STORE BASE_URL N CONCURRENCY
"""

import sys
from pathlib import Path

from pipeline.config.llm import EndpointConfig
from pipeline.llm.client import ChatRequest, open_client
from pipeline.store.database import Store


def questions(n: int) -> list[ChatRequest]:
    return [ChatRequest(({"role": "user", "content": f"question {i}"},)) for i in range(n)]


def endpoint(base_url: str, concurrency: int) -> EndpointConfig:
    return EndpointConfig(
        backend="openai",
        base_url=base_url,
        model="test-model",
        api_key_env=None,
        concurrency=concurrency,
        timeout_s=10,
        backoff_initial_s=0.01,
    )


def main() -> None:
    store_path, base_url, n, concurrency = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with Store(store_path) as store:
        client = open_client(endpoint(base_url, concurrency), store, "worker")
        client.complete_sync(questions(n))
        client.check_failures()
    print(client.tally.line(), flush=True)


if __name__ == "__main__":
    main()
