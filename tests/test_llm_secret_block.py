"""The API key from a Prefect Secret block (`api_key_secret`), on a real temporary Prefect server.

One subprocess (Prefect starts its temporary server once, about 8 s): it asks for a block that does
not exist (a one-line error naming the field and the fix), saves the block, then runs the client
against the test server with the key read from it.
"""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from openai_server import OpenAIServer

from pipeline.orchestration.prefect_env import prefect_environment

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
from prefect.blocks.system import Secret
from pipeline.config.llm import EndpointConfig
from pipeline.llm.client import ChatRequest, open_client
from pipeline.llm.credentials import MissingSecret
from pipeline.store.database import Store

base_url, store_path, key = sys.argv[1:4]
with Store(store_path) as store:
    try:
        open_client(EndpointConfig(backend="openai", base_url=base_url, model="m", api_key_secret="absent"), store, "judge")
    except MissingSecret as exc:
        print("missing:", exc)
    Secret(value=key).save("llm-key")
    config = EndpointConfig(backend="openai", base_url=base_url, model="m", api_key_env=None, api_key_secret="llm-key")
    [answer] = open_client(config, store, "judge").complete_sync([ChatRequest(({"role": "user", "content": "hello"},))])
    print("answer:", answer.text)
"""


@pytest.mark.slow
def test_the_key_comes_from_the_secret_block_when_one_is_named(tmp_path):
    key = f"sk-block-{uuid.uuid4().hex}"
    env = {**os.environ, **prefect_environment(tmp_path / "prefect"), "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    with OpenAIServer() as server:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, server.base_url, str(tmp_path / "store.duckdb"), key],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert [entry.authorization for entry in server.log] == [f"Bearer {key}"]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("missing: api_key_secret: cannot read Prefect Secret block 'absent'")
    assert "prefect block create secret" in lines[0]
    assert lines[-1] == "answer: echo: hello"
    assert key not in done.stdout + done.stderr
    assert key.encode() not in (tmp_path / "store.duckdb").read_bytes()
