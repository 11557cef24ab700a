"""The API key never reaches a log line, the store, an artifact, a fingerprint or an exception
message (issue 10), even when the server quotes it back in an error."""

import json
import logging
import uuid

import pytest
from openai_server import Fault, OpenAIServer

from pipeline import progress
from pipeline.config.llm import EndpointConfig
from pipeline.llm.client import ChatRequest, EndpointFailed, open_client
from pipeline.llm.credentials import REDACTED, public_url
from pipeline.rewards.rubrics import prompt_text
from pipeline.store.database import Store

# The generator is told apart from the judge by the opening of its prompt file (data/prompts/sft_generator.md).
GENERATOR_OPENING = prompt_text("sft_generator")[:40]


@pytest.fixture
def progress_reports(monkeypatch):
    """What the progress bar tells its observers: the Prefect flows publish it as an artifact."""
    reports: list[str] = []
    monkeypatch.setattr(progress, "OBSERVERS", [lambda *args: reports.append(repr(args))])
    return reports


def test_the_key_is_sent_but_written_nowhere(tmp_path, monkeypatch, caplog, capfd, progress_reports):
    key = f"sk-simulacra-{uuid.uuid4().hex}"
    monkeypatch.setenv("SIMULACRA_TEST_KEY", key)
    caplog.set_level(logging.DEBUG)  # the SDK's and httpx's debug lines too
    written: list[str] = []
    with OpenAIServer() as server, Store(tmp_path / "ws" / "store.duckdb") as store:
        config = EndpointConfig(
            backend="openai",
            base_url=server.base_url,
            model=server.model,
            api_key_env="SIMULACRA_TEST_KEY",
            max_retries=1,
            backoff_initial_s=0.01,
            max_failed_fraction=0.1,
        )
        server.faults.extend([Fault("unauthorized"), Fault("unavailable"), Fault("reset"), Fault("unauthorized")])
        client = open_client(config, store, "judge")
        answers = client.complete_sync([ChatRequest(({"role": "user", "content": f"q{i}"},)) for i in range(6)])
        with pytest.raises(EndpointFailed) as failed:
            client.check_failures()
        written += [str(failed.value), repr(client), repr(client.backend), client.tally.line()]
        written += [repr(answer) for answer in answers]
        written += [json.dumps(config.model_dump(mode="json")), str(client.tally.errors)]
        sent = {entry.authorization for entry in server.log}

    assert sent == {f"Bearer {key}"}  # the key was really used: the rest of the test is not vacuous
    assert sum(REDACTED in (answer.error or "") for answer in answers) == 2  # the server quoted it twice
    written += [record.getMessage() for record in caplog.records] + list(capfd.readouterr()) + progress_reports
    assert not [text for text in written if key in text]
    files = [path for path in (tmp_path / "ws").rglob("*") if path.is_file()]
    assert files and not [path for path in files if key.encode() in path.read_bytes()]


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://gpu-node:8000/v1", "http://gpu-node:8000/v1"),
        ("https://user:secret@host/v1", "https://host/v1"),
        ("https://host:443/v1?api_key=secret", "https://host:443/v1"),
    ],
)
def test_a_base_url_is_shown_without_credentials(url, shown):
    assert public_url(url) == shown


def canary_key(prefix: str) -> str:
    """A fresh key whose last four characters are not hexadecimal: the tests look for them in the
    store's bytes, where a tail of four hex digits also occurs by chance (in its ids and digests)."""
    return f"{prefix}{uuid.uuid4().hex}QzkW"


def masked(key: str) -> str:
    """OpenAI's masked form of a key, as its 401 quotes it."""
    return f"{key[:8]}****...{key[-4:]}"


def stored_bytes(root) -> bytes:
    return b"".join(path.read_bytes() for path in root.rglob("*") if path.is_file())


# (the 401 the server sends, the form of the key it quotes)
DISGUISES = [
    ("unauthorized_masked", masked),  # issue 20.8: `sk-canar****...2ad4`, as OpenAI quotes it
    ("unauthorized_reversed", lambda key: key[::-1]),  # issue 29.9
]


@pytest.mark.parametrize("fault,form", DISGUISES, ids=[fault for fault, _ in DISGUISES])
def test_a_disguised_key_in_an_error_is_redacted_everywhere_it_is_written(
    tmp_path, monkeypatch, caplog, capfd, fault, form
):
    """The 401 quotes the key in a form other than verbatim."""
    key = canary_key("sk-canary-")
    monkeypatch.setenv("SIMULACRA_TEST_KEY", key)
    caplog.set_level(logging.DEBUG)
    with OpenAIServer() as server, Store(tmp_path / "ws" / "store.duckdb") as store:
        config = EndpointConfig(
            backend="openai",
            base_url=server.base_url,
            model=server.model,
            api_key_env="SIMULACRA_TEST_KEY",
            max_retries=0,
        )
        server.faults.extend([Fault(fault)] * 3)
        client = open_client(config, store, "sft.generator.0")
        answers = client.complete_sync([ChatRequest(({"role": "user", "content": f"q{i}"},)) for i in range(3)])
        with pytest.raises(EndpointFailed) as failed:
            client.check_failures()
        errors = [row[0] for row in store.execute("SELECT error FROM llm_cache").fetchall()]
    assert len(errors) == 3 and all(REDACTED in error for error in errors)
    written = [
        str(failed.value),
        *(a.error for a in answers),
        *errors,
        *(r.getMessage() for r in caplog.records),
        *capfd.readouterr(),
    ]
    assert not [text for text in written if key[:8] in text or key[-4:] in text or form(key) in text]
    assert form(key).encode() not in stored_bytes(tmp_path / "ws") and key[-4:].encode() not in stored_bytes(
        tmp_path / "ws"
    )
    # The one line names the endpoint, the error and where the key comes from.
    assert (
        "http 401" in str(failed.value)
        and server.base_url in str(failed.value)
        and "$SIMULACRA_TEST_KEY" in str(failed.value)
    )


@pytest.mark.parametrize(
    "text",
    [
        "Incorrect API key provided: {masked}.",
        "key ****{suffix} rejected",
        "key {prefix}**** rejected",
        "Authorization: Bearer {key}",
        "a{key}b",
        "the key, backwards: {reversed}",  # issue 29.9
    ],
)
def test_every_recognisable_form_of_a_known_key_is_redacted(text):
    from pipeline.llm.credentials import redact, remember_secret

    key = f"sk-proj-{uuid.uuid4().hex}"
    remember_secret(key)
    shown = text.format(masked=masked(key), suffix=key[-4:], prefix=key[:10], key=key, reversed=key[::-1])
    redacted = redact(shown)
    assert REDACTED in redacted and key[:8] not in redacted and key[-4:] not in redacted
    assert key[::-1][:8] not in redacted and key[::-1][-4:] not in redacted


def test_a_key_this_process_never_read_is_redacted_by_its_shape():
    """An endpoint that quotes its own environment, or a model reciting a key it was trained on."""
    from pipeline.llm.credentials import redact

    answer = "OPENAI_API_KEY=sk-proj-Q2x9vLm4TtR8wZp1Ys6Kd3Hf\nAWS_ACCESS_KEY_ID=AKIA2E0A8F3B244C9986\n"
    assert redact(answer) == f"OPENAI_API_KEY={REDACTED}\nAWS_ACCESS_KEY_ID={REDACTED}\n"


def test_ordinary_text_with_dots_and_stars_is_left_alone():
    from pipeline.llm.credentials import redact, remember_secret

    remember_secret(f"sk-proj-{uuid.uuid4().hex}")
    text = "Loading... done. **bold** and a path ./a/b; sk is a word"
    assert redact(text) == text


def test_an_answer_that_echoes_the_key_is_stored_redacted_never_judged_nor_kept(tmp_path, monkeypatch):
    """Issue 20.9: a debugging proxy echoes the Authorization header into the answer's thinking."""
    from pipeline.config.sft import GeneratorConfig, JudgeConfig
    from pipeline.sft.generators import build_generators, build_judge, judge_label
    from pipeline.sft.queries import Query
    from pipeline.sft.sampling import RejectionSampler
    from pipeline.store.schema import SystemPrompt

    key = canary_key("sk-echoed-")
    monkeypatch.setenv("SIMULACRA_TEST_KEY", key)

    def answer(request: dict) -> str:
        if request["messages"][0]["content"].startswith(GENERATOR_OPENING):
            return f"<think>\nheaders: Authorization: Bearer {key}\n</think>\n\nfile.txt\n"
        return json.dumps(
            {
                "content_classes": [],
                "format": 5,
                "factuality": 5,
                "consistency": 5,
                "realism": 5,
                "quality": 5,
                "rationale": f"looks right ({masked(key)})",
            }
        )

    endpoint = {"backend": "openai", "model": "test-model", "api_key_env": "SIMULACRA_TEST_KEY", "max_retries": 0}
    with OpenAIServer(answer=answer) as server, Store(tmp_path / "ws" / "store.duckdb") as store:
        endpoint["base_url"] = server.base_url
        generators, _ = build_generators(
            [GeneratorConfig(kind="endpoint", samples=2, endpoint=endpoint)], store, tmp_path, "unused", "pools"
        )
        judge_config = JudgeConfig(kind="llm", endpoint=endpoint)
        judge, _ = build_judge(judge_config, store)
        query = Query("t1", 1, "terminal", SystemPrompt(), (), "ls", "file.txt\n", 0)
        sampler = RejectionSampler(
            store,
            generators,
            judge,
            judge_label(judge_config),
            min_score=1.0,
            min_agreement=3.0,
            seed=0,
            batch_queries=4,
        )
        sampler.run([query])
        statuses = [row[0] for row in store.execute("SELECT parse_status FROM sft_candidates").fetchall()]
        kept = store.execute("SELECT count(*) FROM sft_samples WHERE kept").fetchone()[0]
        sent = [json.dumps(entry.body) for entry in server.log]
    assert statuses == ["held_secret", "held_secret"] and kept == 0
    assert len(sent) == 2  # the two candidates; nothing went on to the judge
    assert not [body for body in sent if key in body]
    assert key.encode() not in stored_bytes(tmp_path / "ws") and key[-4:].encode() not in stored_bytes(tmp_path / "ws")


@pytest.mark.parametrize(
    "url, where",
    [("http://user:SECRET@host/v1", "user info"), ("https://host/v1?api-key=SECRET", "query parameter `api-key`")],
)
def test_credentials_in_a_base_url_are_refused_naming_the_field_and_the_variable(url, where):
    """Issue 20.10: user info in the URL would be stored with the flow run, and the Bearer key not sent."""
    from pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError) as refused:
        load_config(
            None,
            [
                {
                    "sft": {
                        "judge": {
                            "kind": "llm",
                            "endpoint": {
                                "backend": "openai",
                                "model": "m",
                                "base_url": url,
                                "api_key_env": "JUDGE_KEY",
                            },
                        }
                    }
                }
            ],
        )
    message = str(refused.value)
    assert "SECRET" not in message
    assert f"field `sft.judge.endpoint.base_url`: the URL holds credentials ({where})" in message
    assert "environment variable JUDGE_KEY" in message
