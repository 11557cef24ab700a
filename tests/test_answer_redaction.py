"""Credentials kept out of served answers (pipeline/serving/answer_redaction.py): a streamed answer shown only as far
as no later token can change its redaction, and the environment classes' own redaction of what any server sends.

The served model itself reciting a key, whole, streamed and in logprobs, is in tests/test_serve.py.
"""

import random
import string

import pytest

from pipeline.llm import credentials
from pipeline.llm.batching import TokenLogprob
from pipeline.secret_shapes import REDACTED
from pipeline.serving.answer_redaction import SettledText, SettledTokens, redacted_tokens, settled_length
from pipeline.serving.environment import WorldModelEnvironment
from tests.openai_server import OpenAIServer

KNOWN_KEY = "pa$$:w0rd!x7Q#u9"  # a key this process read, with characters no credential shape has


def _credentials(rng: random.Random) -> list[str]:
    def chars(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    return [
        "sk-" + chars(40),
        "hf_" + chars(34),
        "ghp_" + chars(36),
        "AKIA" + chars(16, string.ascii_uppercase + string.digits),
        "xoxb-" + chars(20),
        "SG." + chars(22) + "." + chars(43),
        "eyJ" + chars(12) + ".eyJ" + chars(12) + "." + chars(20),
        "AccountKey=" + chars(44) + "==",
        "aws_secret_access_key = " + chars(40, string.ascii_letters + string.digits + "/+"),
        "AWS_SECRET_ACCESS_KEY:" + chars(40),
        "Authorization: Bearer " + chars(30),
        "bearer   " + chars(25) + "==",
        "-----BEGIN RSA PRIVATE KEY-----\n" + chars(64) + "\n" + chars(64) + "\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + chars(64) + "\n-----END PGP PRIVATE KEY BLOCK-----",
        "-----BEGIN OPENSSH PRIVATE KEY-----\n" + chars(64) + "\n",  # cut short: no end line
        '{"SecretAccessKey": "' + chars(40, string.ascii_letters + string.digits + "/+") + '"}',
        "export AWS_SECRET_ACCESS_KEY='" + chars(40) + "'",
        'secretAccessKey:\n   \\"' + chars(40) + '\\"',
        "postgres://admin:" + chars(12, string.ascii_letters + string.digits + "!#%") + "@db:5432/app",
        "redis://:" + chars(10) + "@cache",
        KNOWN_KEY,
        KNOWN_KEY[::-1],
    ]


FILLER = ['ls -la\n', '{"a": 1, ', "the key is ", " ", "\n", "HOME=/root\n", "token=", '"', "x", "Bearer", ": ", "SecretAccessKey", "'",
          "https://", "example.com:8443/v2 ", "user:", "@host", "!",
          "-----BEGIN CERTIFICATE-----\nMIIBkTCB+wIJAK\n-----END CERTIFICATE-----\n", "path/to/file.txt "]  # fmt: skip


@pytest.fixture
def known_key(monkeypatch):
    monkeypatch.setattr(credentials, "_known", {KNOWN_KEY})


def _answers(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        parts = [rng.choice(_credentials(rng)) if rng.random() < 0.4 else rng.choice(FILLER) for _ in range(8)]
        yield rng, "".join(parts[: rng.randint(1, 8)])


def test_a_streamed_answer_never_shows_what_its_redaction_takes_back(known_key):
    """Grown a few characters at a time, what is shown only grows, is always the start of the whole answer's
    redaction and ends equal to it: no delta ever held a key's characters."""
    for rng, answer in _answers(1500, seed=0):
        whole, shown, at = credentials.redact(answer), "", 0
        settled = SettledText()
        while at < len(answer):
            at = min(len(answer), at + rng.randint(1, 6))
            now = settled.advance(answer[:at], final=at == len(answer))
            assert now.startswith(shown) and whole.startswith(now), (answer[:at], now, whole)
            shown = now
        assert shown == whole


def test_logprob_tokens_in_a_credential_say_so_and_no_token_holds_one(known_key):
    """Tokens cut at random over the answer: every one is released once, in order, by the end; those with a
    credential's characters (the whole answer's redaction's) are `REDACTED` where it starts and empty after, the
    others as they are."""
    for rng, answer in _answers(800, seed=1):
        settled, released, pieces, at = SettledTokens(), [], [], 0
        while at < len(answer):
            end = min(len(answer), at + rng.randint(1, 5))
            pieces.append(answer[at:end])
            settled.add(TokenLogprob(len(pieces), -0.5, ((7, -1.0),)), answer[at:end])
            released += settled.release(final=end == len(answer))
            at = end
        assert [token.token_id for token, _ in released] == list(range(1, len(pieces) + 1))
        spans, begin = credentials.secret_spans(answer), 0
        for (_, shown), piece in zip(released, pieces, strict=True):
            inside = [(a, b) for a, b in spans if a < begin + len(piece) and begin < b]
            assert shown == (None if not inside else REDACTED if any(a >= begin for a, _ in inside) else ""), answer
            begin += len(piece)
        assert released == redacted_tokens([(TokenLogprob(i + 1, -0.5, ((7, -1.0),)), p) for i, p in enumerate(pieces)])


@pytest.mark.parametrize(
    ("text", "settled"),
    [
        ("ls -la\nnotes.txt", len("ls -la\n")),  # a run of key characters waits for the one after it
        ("ls -la\nnotes.txt\n", len("ls -la\nnotes.txt\n")),
        ('{"token": "sk-abc', len('{"token": "')),
        ("curl -H 'Authorization: Bearer ", len("curl -H 'Authorization: ")),  # the lead waits for its token
        ("Bearer: x ", len("Bearer: x ")),  # not the shape's lead: `bearer`, spaces, the token
        ("aws_secret_access_key = ", 0),
        ("a -----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n", 2),  # an open key block
        ("a -----BEGIN CERTIFICATE-----\nMIIB\n", len("a -----BEGIN CERTIFICATE-----\nMIIB\n")),
        ('"-----BEGIN RSA PRIVATE KEY-----\nabc" ', len('"-----BEGIN RSA PRIVATE KEY-----\nabc" ')),  # ends at a quote
    ],
)
def test_what_is_settled(text, settled):
    assert settled_length(text) == settled


def test_the_environment_redacts_what_any_server_sends(tmp_path):
    """vLLM's server sends a recited key as the model wrote it: the observation an agent gets, and the history it
    keeps, hold `REDACTED`; the thinking too."""
    token = "ghp_" + "R8sT2vWx9YzA4bC6dE1fG3hJ5kL7mN0pQ2rSu4"
    answers = iter([f"GITHUB_TOKEN={token}\n", f"<think>\nit prints {token}\n</think>\n\nGITHUB_TOKEN={token}"])
    with OpenAIServer(answer=lambda request: next(answers)) as server:
        env = WorldModelEnvironment(server.base_url, server.model, "terminal", prompt_format="sft")
        env.reset("print the environment")
        assert env.step("env") == f"GITHUB_TOKEN={REDACTED}\n"
        thinking = WorldModelEnvironment(
            server.base_url, server.model, "terminal", prompt_format="sft", enable_thinking=True
        )
        thinking.reset("print the environment")
        assert thinking.step("env") == f"GITHUB_TOKEN={REDACTED}"
        assert thinking.last_thinking == f"it prints {REDACTED}"
    assert env.history == [("env", f"GITHUB_TOKEN={REDACTED}\n")]
