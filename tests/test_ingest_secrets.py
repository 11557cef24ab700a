"""Credentials in ingested data (an agent's shell that ran `env`, a key pasted into a task) are redacted before
anything is stored: the trajectory, its turns and the quarantined record alike, by the SQL fast path and by the
Python adapter alike; text that only resembles a key is kept; the run says how many rows it redacted. And the
shapes themselves (pipeline/secret_shapes.py): Python's `re` and DuckDB's RE2 read the pattern alike."""

import json

import duckdb
import pytest

from pipeline.formats.simulacra_jsonl import to_record
from pipeline.secret_shapes import FIRST_SHAPES, PATTERN, REDACTED, redact_shapes, secret_kind, sql_redacted
from pipeline.store.database import Store
from pipeline.store.schema import SystemPrompt, Trajectory, Turn
from stages import ingest

# Made up, in each provider's documented shape.
KEYS = {
    "OpenAI or Anthropic API key": "sk-proj-Q2x9vLm4TtR8wZp1Ys6Kd3Hf",
    "Hugging Face token": "hf_aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3",
    "GitHub token": "ghp_0123456789abcdefABCDEF0123456789abcd",
    "AWS access key id": "AKIA2E0A8F3B244C9986",
    "Google API key": "AIzaSyD-1234567890abcdefghijklmnopqrstu",
    "Slack token": "xoxb-2048-4096-abcdefABCDEF",
    "Stripe secret key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "GitLab token": "glpat-xYz12AbC34dEf56GhI78jK",
    "npm token": "npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "PyPI token": "pypi-AgEIcHlwaS5vcmcCJGE0ZDc3NzQ2LTQ5NjAtNGIyMy1hYWU1LWZlN2M0NjFmNjEwOAACKlszLCJkZjA",
    "SendGrid API key": "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",
    "Google OAuth access token": "ya29.a0AfH6SMBx3Yk9Lq2Wm7Tz5Rv8Np1Qs4",
    "DigitalOcean token": "dop_v1_" + "0123456789abcdef" * 4,
    "JSON Web Token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "Azure storage account key": "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
    "bearer token": "Bearer 9f2c4e6a8b0d1f3e5a7c9b1d3f5e7a9c",
    "private key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
}
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
# Credentials known by their name: the name and its separator stay, the value is replaced, JSON stays JSON.
NAMED_FORMS = [
    "aws_secret_access_key = {}",  # ~/.aws/credentials
    'export AWS_SECRET_ACCESS_KEY="{}"',
    "aws_secret_access_key: '{}'",  # YAML
    '{{"aws_secret_access_key": "{}"}}',
    '{{"Credentials": {{"AccessKeyId": "ASIA…", "SecretAccessKey": "{}"}}}}',  # `aws sts get-session-token`
    "TF_VAR_aws_secret_access_key={}",
    "new S3Client({{secretAccessKey: '{}'}})",
    '"{{\\"SecretAccessKey\\": \\"{}\\"}}"',  # as the JSON text of a string holding JSON
]
# Passwords in URLs: the scheme, the user and what follows the `@` stay.
URL_FORMS = [
    ("DATABASE_URL=postgres://admin:S3cr3tP4ssw0rd!@db.internal:5432/app", "postgres://admin:{}@db.internal", "S3cr3t"),
    (
        '{"remote": "https://x-access-token:ghs_abc123DEF@github.com/org/repo.git"}',
        "https://x-access-token:{}@github",
        "ghs_abc",
    ),
    ("redis://:hunter2@cache:6379/0 and amqp://guest:guest@rabbit/", "redis://:{}@cache", "hunter2"),
]
# Private keys that are not one PEM block with both its lines.
KEY_BLOCKS = {
    "PGP": "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGN0ZXN0AQgA0M1N\n=Ab3D\n-----END PGP PRIVATE KEY BLOCK-----",
    "cut short": "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nMIIEowIBAAKCAQEA3bN7q+Xx\nQ2w9",
}
# Text of the same look that is not a credential: kept as it is.
LOOKALIKES = [
    "disk-0123456789abcdefghijklmnop",  # `sk-` inside a word
    "task-sk-short",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "AKIA-not-a-key",
    "see hf_hub_download for details",
    "sk_live_short",
    "curl -H 'Authorization: Bearer $TOKEN' https://api.example.com",
    "the bearer of this letter",
    "eyJhbGciOiJIUzI1NiJ9 alone is a header, not a token",
    "npm_config_cache=/tmp/npm",
    "aws_secret_access_key = <your secret key>",
    "AccountKey=short;",
    "https://example.com:8443/path@v2 and ssh://git@github.com:22/org/repo",  # a port, a user without a password
]


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_each_shape_is_found_and_replaced_by_re_and_by_duckdb(kind):
    text = f"before {KEYS[kind]} after"
    assert secret_kind(text) == kind
    assert redact_shapes(text) == f"before {REDACTED} after"
    [(stored,)] = duckdb.sql(f"SELECT {sql_redacted('t')} FROM (SELECT ? AS t)", params=[text]).fetchall()
    assert stored == f"before {REDACTED} after"


@pytest.mark.parametrize("form", NAMED_FORMS)
def test_a_named_credentials_value_is_replaced_and_its_name_kept_by_re_and_by_duckdb(form):
    text = form.format(AWS_SECRET)
    assert secret_kind(text) == "AWS secret access key"
    [(stored,)] = duckdb.sql(f"SELECT {sql_redacted('t')} FROM (SELECT ? AS t)", params=[text]).fetchall()
    assert redact_shapes(text) == stored == form.format(REDACTED)
    if form.startswith("{"):
        json.loads(stored)


@pytest.mark.parametrize("text, kept, password", URL_FORMS)
def test_a_password_in_a_url_is_replaced_and_the_url_around_it_kept(text, kept, password):
    assert secret_kind(text) == "password in a URL"
    [(stored,)] = duckdb.sql(f"SELECT {sql_redacted('t')} FROM (SELECT ? AS t)", params=[text]).fetchall()
    assert redact_shapes(text) == stored
    assert kept.format(REDACTED) in stored and password not in stored
    if text.startswith("{"):
        json.loads(stored)


@pytest.mark.parametrize("kind", sorted(KEY_BLOCKS))
def test_pgp_blocks_and_keys_cut_before_their_end_are_private_keys(kind):
    text = f"$ cat key\n{KEY_BLOCKS[kind]}"
    assert secret_kind(text) == "private key"
    [(stored,)] = duckdb.sql(f"SELECT {sql_redacted('t')} FROM (SELECT ? AS t)", params=[text]).fetchall()
    assert redact_shapes(text) == stored == f"$ cat key\n{REDACTED}"
    # In JSON text, newlines escaped, the replacement stays inside its string.
    record = json.dumps({"observation": text, "exit": 0})
    [(stored,)] = duckdb.sql(f"SELECT {sql_redacted('t')} FROM (SELECT ? AS t)", params=[record]).fetchall()
    assert (
        json.loads(stored) == json.loads(redact_shapes(record)) == {"observation": f"$ cat key\n{REDACTED}", "exit": 0}
    )


@pytest.mark.parametrize("text", LOOKALIKES)
def test_text_that_only_resembles_a_key_is_kept(text):
    assert secret_kind(text) is None and redact_shapes(text) == text
    assert duckdb.sql(f"SELECT regexp_matches(?, '{PATTERN}')", params=[text]).fetchall() == [(False,)]


def leaky(n: int) -> Trajectory:
    return Trajectory(
        source="",
        domain="terminal",
        task=f"Deploy with the token {KEYS['GitHub token']}",
        system=SystemPrompt(
            task_description="A Linux shell.", initial_state=f"~/.aws/credentials holds {KEYS['AWS access key id']}"
        ),
        turns=[
            Turn(action="env | grep KEY", observation=f"OPENAI_API_KEY={KEYS['OpenAI or Anthropic API key']}\n"),
            Turn(action=f"curl -H 'Authorization: Bearer {KEYS['Hugging Face token']}' hf.co", observation="ok\n"),
            Turn(action="cat ~/.ssh/id_ed25519", observation=KEYS["private key"] + "\n"),
            Turn(action=f"echo {n} {' '.join(LOOKALIKES)}", observation=f"{n} {' '.join(LOOKALIKES)}\n"),
        ],
    )


@pytest.mark.parametrize("fast_path", [True, False], ids=["sql", "python"])
def test_no_key_reaches_the_store_and_the_run_says_how_many_rows_held_one(config, tmp_path, fast_path):
    config.ingest.sql_fast_path = fast_path
    malformed = {"schema": "simulacra/trajectory-v1", "turns": [{"action": 7, "observation": KEYS["Slack token"]}]}
    path = tmp_path / "leaky.jsonl"
    path.write_text(
        "\n".join([json.dumps(to_record(leaky(0))), json.dumps(malformed), json.dumps(to_record(leaky(1)))])
    )
    with Store(config.workspace.database_path) as store:
        result = ingest.run(config, store, paths=[str(path)])
        assert (result.metrics["added"], result.metrics["quarantined"]) == (2, 1)
        # Per trajectory: itself (task, initial state) and three of its four turns; and the quarantined record.
        assert result.metrics["secrets_redacted"] == 2 * (1 + 3) + 1
        assert "9 row(s) held a credential, redacted" in result.summary
        observations = [row["observation"] for row in store.rows("SELECT observation FROM turns ORDER BY ALL")]
        tasks = [row["task"] for row in store.rows("SELECT task FROM trajectories")]
    assert f"OPENAI_API_KEY={REDACTED}\n" in observations and f"{REDACTED}\n" in observations
    assert tasks == [f"Deploy with the token {REDACTED}"] * 2
    assert any(" ".join(LOOKALIKES) in observation for observation in observations)  # left as written
    database = config.workspace.database_path.read_bytes()
    everything = json.dumps(
        {
            table: duckdb.connect(str(config.workspace.database_path), read_only=True)
            .execute(f"SELECT * FROM {table}")
            .fetchall()
            for table in ("trajectories", "turns", "quarantine")
        },
        default=str,
    )
    for kind, key in KEYS.items():
        fragment = key.splitlines()[1] if kind == "private key" else key
        assert fragment not in everything, kind
        assert fragment.encode() not in database, kind


def test_a_rerun_redacts_nothing_twice(config, tmp_path):
    path = tmp_path / "leaky.jsonl"
    path.write_text(json.dumps(to_record(leaky(0))) + "\n")
    with Store(config.workspace.database_path) as store:
        first = ingest.run(config, store, paths=[str(path)])
        again = ingest.run(config, store, paths=[str(path)], rescan=True)
    assert (first.metrics["secrets_redacted"], again.metrics["secrets_redacted"]) == (4, 0)
    assert (again.metrics["added"], again.metrics["duplicates"]) == (0, 1)


def test_a_store_ingested_before_redaction_is_swept_when_it_is_next_opened_for_writing(config):
    """Migration 12: the text columns of every table, a JSON column's text included, and nothing else touched."""
    key, hf = KEYS["OpenAI or Anthropic API key"], KEYS["Hugging Face token"]
    private = KEYS["private key"].replace("\n", "\\n")  # as JSON text holds it
    with Store(config.workspace.database_path) as store:
        store.execute(
            "INSERT INTO trajectories (trajectory_id, source, format, domain, task_description, tools, num_turns, "
            "location, ingested_at) VALUES ('t1', 's', 'f', 'terminal', ?, ?, 1, 'x:1', now())",
            [f"key {key}", json.dumps([{"name": "login", "token": hf, "pem": KEYS["private key"]}])],
        )
        store.execute("INSERT INTO turns VALUES ('t1', 0, 'env', ?, NULL, false, NULL)", [f"OPENAI_API_KEY={key}\n"])
        store.execute("INSERT INTO turns VALUES ('t1', 1, 'ls', 'disk-0123456789abcdefghijklmnop', NULL, false, NULL)")
        store.execute(
            "INSERT INTO llm_cache VALUES ('k', 'judge', 'openai', 'm', ?, ?, NULL, 1, 1, 1, now())",
            [json.dumps({"messages": [{"role": "user", "content": f"{key} and {private}"}]}), f"echo {hf}"],
        )
        store.execute("DELETE FROM schema_migrations WHERE version = 12")  # as a store written before it
    with Store(config.workspace.database_path) as store:
        assert store.scalar("SELECT count(*) FROM schema_migrations WHERE version = 12") == 1  # applied on opening
        tools = json.loads(store.scalar("SELECT tools FROM trajectories"))
        observations = [row["observation"] for row in store.rows("SELECT observation FROM turns ORDER BY turn_index")]
        request = json.loads(store.scalar("SELECT request FROM llm_cache"))
        answer = store.scalar("SELECT answer FROM llm_cache")
        description = store.scalar("SELECT task_description FROM trajectories")
    assert tools == [{"name": "login", "token": REDACTED, "pem": REDACTED}]
    assert observations == [f"OPENAI_API_KEY={REDACTED}\n", "disk-0123456789abcdefghijklmnop"]
    assert request["messages"][0]["content"] == f"{REDACTED} and {REDACTED}"
    assert (answer, description) == (f"echo {REDACTED}", f"key {REDACTED}")


def test_a_store_swept_before_the_later_shapes_is_swept_for_them_when_next_opened(config):
    """Migration 13: a store that migration 12 swept before JSON Web Tokens, bearer tokens and the rest were shapes
    holds them as ingested; opened for writing, it is swept again, and text that only resembles them is kept."""
    later = [kind for kind in KEYS if kind not in FIRST_SHAPES]
    with Store(config.workspace.database_path) as store:
        for index, kind in enumerate(later):
            store.execute(f"INSERT INTO turns VALUES ('t1', {index}, 'env', ?, NULL, false, NULL)", [f"{KEYS[kind]}\n"])
        store.execute(
            f"INSERT INTO turns VALUES ('t1', {len(later)}, 'ls', ?, NULL, false, NULL)", [" ".join(LOOKALIKES)]
        )
        store.execute("DELETE FROM schema_migrations WHERE version = 13")  # as a store written before it
    with Store(config.workspace.database_path) as store:
        assert store.scalar("SELECT count(*) FROM schema_migrations WHERE version = 13") == 1
        observations = [row["observation"] for row in store.rows("SELECT observation FROM turns ORDER BY turn_index")]
    assert len(later) == 10
    assert observations == [f"{REDACTED}\n"] * len(later) + [" ".join(LOOKALIKES)]


def test_a_store_swept_before_the_named_and_cut_forms_is_swept_for_them_when_next_opened(config):
    """Migration 14: an AWS secret after its quoted name, a PGP block, a key cut before its end line."""
    texts = [form.format(AWS_SECRET) for form in NAMED_FORMS] + list(KEY_BLOCKS.values()) + [URL_FORMS[0][0]]
    with Store(config.workspace.database_path) as store:
        for index, text in enumerate(texts):
            store.execute(f"INSERT INTO turns VALUES ('t1', {index}, 'env', ?, NULL, false, NULL)", [text])
        store.execute("DELETE FROM schema_migrations WHERE version = 14")  # as a store written before it
    with Store(config.workspace.database_path) as store:
        assert store.scalar("SELECT count(*) FROM schema_migrations WHERE version = 14") == 1
        observations = [row["observation"] for row in store.rows("SELECT observation FROM turns ORDER BY turn_index")]
    assert observations == [form.format(REDACTED) for form in NAMED_FORMS] + [REDACTED] * len(KEY_BLOCKS) + [
        f"DATABASE_URL=postgres://admin:{REDACTED}@db.internal:5432/app"
    ]


@pytest.mark.parametrize("fast_path", [True, False], ids=["sql", "python"])
def test_named_and_cut_credentials_in_observations_and_metadata_reach_no_table(config, tmp_path, fast_path):
    config.ingest.sql_fast_path = fast_path
    sts = f'{{"Credentials": {{"SecretAccessKey": "{AWS_SECRET}", "SessionToken": "x"}}}}'
    record = to_record(leaky(0))
    record["turns"] += [
        {"action": "aws sts get-session-token", "observation": sts},
        {"action": "gpg --export-secret-keys -a", "observation": KEY_BLOCKS["PGP"]},
        {"action": "head -4 id_rsa", "observation": KEY_BLOCKS["cut short"], "metadata": {"cwd": "/root"}},
    ]
    record["metadata"] = {"info": {"env": {"aws_secret_access_key": AWS_SECRET, "HOME": "/root"}}}
    path = tmp_path / "leaky.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with Store(config.workspace.database_path) as store:
        result = ingest.run(config, store, paths=[str(path)])
        assert result.metrics["added"] == 1
        metadata = json.loads(store.scalar("SELECT metadata FROM trajectories"))
        observations = [row["observation"] for row in store.rows("SELECT observation FROM turns ORDER BY turn_index")]
    assert metadata == {"info": {"env": {"aws_secret_access_key": REDACTED, "HOME": "/root"}}}
    assert json.loads(observations[-3]) == {"Credentials": {"SecretAccessKey": REDACTED, "SessionToken": "x"}}
    assert observations[-2:] == [REDACTED, REDACTED]
    database = config.workspace.database_path.read_bytes()
    for fragment in (AWS_SECRET, "lQOYBGN0ZXN0AQgA0M1N", "MIIEowIBAAKCAQEA3bN7q"):
        assert fragment.encode() not in database, fragment


def test_a_key_across_the_quarantines_cut_and_a_key_in_a_records_location_are_redacted(config, tmp_path):
    """The quarantined text is cut at `max_raw_chars_quarantined` after its redaction, not before: a key across the
    cut keeps none of its start. A keyed file's keys are part of where each record was read: redacted there too."""
    key = KEYS["OpenAI or Anthropic API key"]
    config.ingest.max_raw_chars_quarantined = 140
    cut = tmp_path / "cut.jsonl"
    cut.write_text(json.dumps({"schema": "simulacra/trajectory-v1", "task": "x" * 90, "note": f"{key}", "turns": 7}))
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    chat = [
        {"role": "user", "content": "What is here?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "notes.txt"},
    ]
    keyed = tmp_path / "keyed.json"  # AgentBench's layout: runs by task name
    keyed.write_text(json.dumps({key: [{"role": "user", "content": 3}], f"deploy with {key}": chat}))
    with Store(config.workspace.database_path) as store:
        result = ingest.run(config, store, paths=[str(cut), str(keyed)])
        quarantined = store.rows("SELECT location, raw FROM quarantine ORDER BY location")
        locations = [row["location"] for row in store.rows("SELECT location FROM trajectories")]
    assert result.metrics["quarantined"] == 2
    raw = next(row["raw"] for row in quarantined if row["location"].startswith(str(cut)))
    assert key[:12] not in raw and len(raw.split("...")[0]) == 140, raw
    keyed_rows = [row["location"] for row in quarantined if row["location"].startswith(str(keyed))]
    assert keyed_rows == [f"{keyed}[{REDACTED}]"]
    assert locations == [f"{keyed}[deploy with {REDACTED}]"]
    assert key.encode() not in config.workspace.database_path.read_bytes()
