"""The SFT stage end to end: real DuckDB, a real OpenAI-protocol server on 127.0.0.1, real subprocesses,
real training of the tiny model.

- SIGKILL mid-sampling, then rerun: the server's log shows no request answered twice, and the
  sft tables equal those of an uninterrupted run.
- The API key reaches the server and nothing else: not the logs, the store, the run's files or
  the fingerprints.
- The offline path (retrieval + the local transformers model, the similarity judge) keeps queries,
  trains, registers a checkpoint and reports before/after scores.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config
from pipeline.config.model import TinyModelConfig
from pipeline.rewards.rubrics import prompt_text
from pipeline.store.database import Store
from pipeline.training.tiny_model import build_tiny_model
from stages import filter as filter_stage
from stages import ingest, score, split
from tests.openai_server import OpenAIServer

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-simulacra-test-5f1e9c2a7b3d48e6a0c4"
SFT_TABLES = {
    "sft_candidates": "candidate_id",
    "judgements": "judgement_id",
    "sft_samples": "query_id, selection",
}

# The generator is told apart from the judge by the opening of its prompt file (data/prompts/sft_generator.md).
GENERATOR_OPENING = prompt_text("sft_generator")[:40]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A workspace with the demo's terminal and tool-call trajectories split into pools, and a tiny base model."""
    root = tmp_path_factory.mktemp("sft-prepared")
    config = load_config(None, [{"workspace": {"path": str(root / "workspace")}}])
    with Store(config.workspace.database_path) as store:
        ingest.run(
            config, store, paths=[str(REPO / "data/demo/terminal.jsonl"), str(REPO / "data/demo/tool_calls.json")]
        )
        filter_stage.run(config, store)
        score.run(config, store)
        split.run(config, store)
    build_tiny_model(TinyModelConfig(), [REPO / "data/demo/terminal.jsonl"], root / "base-model")
    return root


def _digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def scripted_answer(request: dict) -> str:
    """Deterministic answers by role (told apart by their system prompts): candidates that do not parse, judges
    biased to a position. A judge's answers that are no judgement are rejected as they arrive and asked again
    (test_a_judge_answering_prose_fails_the_stage_and_its_rerun_asks_again)."""
    system, last = request["messages"][0]["content"], request["messages"][-1]["content"]
    if system.startswith(GENERATOR_OPENING):
        variant = _digest(json.dumps(request["messages"]) + str(request.get("seed"))) % 6
        if variant == 0:
            return "I think the output is: done"  # no thinking block: stored as missing_think
        return f"<think>\nThe action `{last[:40]}` prints its result.\n</think>\n\nresult {variant}\n"
    prediction = last.split("## Predicted observation\n")[-1]
    if "## Criteria" in system:
        score = 1 + _digest(prediction) % 5
        return json.dumps(
            {
                "content_classes": ["deterministic output"],
                "format": score,
                "factuality": score,
                "consistency": 5,
                "realism": 4,
                "quality": score,
                "rationale": "scripted",
            }
        )
    return json.dumps({"winner": "A" if _digest(last) % 3 else "tie", "rationale": "scripted"})


def write_config(root: Path, base_url: str) -> Path:
    endpoint = {
        "backend": "openai",
        "base_url": base_url,
        "model": "test-model",
        "concurrency": 1,
        "max_retries": 0,
        "timeout_s": 30,
    }
    config = {
        "workspace": {"path": str(root / "workspace")},
        "model": {"base": str(root / "base-model")},
        "cpt": {"max_length": 512, "eval_max_sequences": 4},
        "validation": {"max_queries": 2, "max_tokens": 1024},
        "sft": {
            "generators": [
                {"kind": "endpoint", "samples": 2, "endpoint": {**endpoint, "seed": 0, "max_tokens": 640}},
                {"kind": "retrieval", "samples": 1},
            ],
            "judge": {"kind": "llm", "endpoint": {**endpoint, "temperature": 0.0}},
            "base_model": str(root / "base-model"),
            "min_score": 2.5,
            "max_queries": 9,
            "batch_queries": 3,
            "max_length": 1024,
            "max_steps": 2,
            "save_steps": 1,
            "tokens_per_step": 2048,
            "micro_batch_rows": 2,
            "learning_rate": 1e-3,
        },
    }
    path = root / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_sft(config_path: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OPENAI_API_KEY": KEY, "PYTHONPATH": str(REPO)}
    handle = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "--config", str(config_path), "sft"],
        cwd=REPO,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )


def workspace_copy(prepared: Path, name: str) -> Path:
    # Beside the module's prepared workspace, named after it: other modules' copies share the base folder.
    root = prepared.parent / f"{prepared.name}-{name}"
    shutil.copytree(prepared, root)
    return root


def table_rows(root: Path) -> dict[str, list[tuple]]:
    with Store(root / "workspace" / "simulacra.duckdb", read_only=True) as store:
        result = {}
        for table, key in SFT_TABLES.items():
            columns = [c for c in store.rows(f"DESCRIBE {table}") if c["column_name"] != "created_at"]
            names = ", ".join(c["column_name"] for c in columns)
            result[table] = store.execute(f"SELECT {names} FROM {table} ORDER BY {key}").fetchall()
        return result


def answered(server: OpenAIServer) -> list[str]:
    """Request bodies the server answered (sent a completion for), canonical JSON."""
    return [json.dumps(e.body, sort_keys=True) for e in server.log if e.outcome == "answered" and e.answer is not None]


class KillSwitch:
    """Answers like `scripted_answer` until the `at`-th request, which it holds until released and then
    drops (no answer is sent): the moment the test kills the stage."""

    def __init__(self, at: int):
        self.at = at
        self.count = 0
        self.lock = threading.Lock()
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: dict) -> str:
        with self.lock:
            self.count += 1
            number = self.count
        if number == self.at:
            self.reached.set()
            self.release.wait(60)
            raise ConnectionAbortedError("the client was killed while this request was in flight")
        return scripted_answer(request)


def test_sigkill_mid_sampling_then_rerun_asks_nothing_twice_and_equals_an_uninterrupted_run(prepared):
    uninterrupted, killed = workspace_copy(prepared, "uninterrupted"), workspace_copy(prepared, "killed")
    with OpenAIServer(answer=scripted_answer) as server:
        config = write_config(uninterrupted, server.base_url)
        assert start_sft(config, uninterrupted / "run.log").wait(timeout=900) == 0, (
            uninterrupted / "run.log"
        ).read_text()
        reference_requests = answered(server)

    # About 15 requests a batch of three queries (6 candidates, their pointwise judgements, the pairwise
    # judgements of the candidates that pass both gates): the 30th is after the first batch is committed whole.
    switch = KillSwitch(at=30)
    with OpenAIServer(answer=switch) as server:
        config = write_config(killed, server.base_url)
        process = start_sft(config, killed / "run.log")
        assert switch.reached.wait(600), (killed / "run.log").read_text()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        switch.release.set()
        before_rerun = len(answered(server))
        assert start_sft(config, killed / "run.log").wait(timeout=900) == 0, (killed / "run.log").read_text()
        requests = answered(server)
        authorizations = {entry.authorization for entry in server.log}

    assert before_rerun == 29
    duplicates = [body for body, count in Counter(requests).items() if count > 1]
    assert not duplicates, f"{len(duplicates)} request(s) answered twice"
    assert sorted(requests) == sorted(reference_requests)
    assert table_rows(killed) == table_rows(uninterrupted)
    tables = table_rows(killed)
    statuses = Counter(row[10] for row in tables["sft_candidates"])  # parse_status
    assert statuses["ok"] > 0 and statuses["missing_think"] > 0

    # The key was sent (so the grep below can fail) and is nowhere else.
    assert authorizations == {f"Bearer {KEY}"}
    assert_key_absent(killed)
    assert_key_absent(uninterrupted)


def assert_key_absent(root: Path) -> None:
    found = [str(path) for path in root.rglob("*") if path.is_file() and KEY.encode() in path.read_bytes()]
    assert not found, f"the API key is in {found}"
    with Store(root / "workspace" / "simulacra.duckdb", read_only=True) as store:
        tables = [row["name"] for row in store.rows("SHOW TABLES")]
        for table in tables:
            text = json.dumps(store.execute(f"SELECT * FROM {table}").fetchall(), default=str)
            assert KEY not in text, f"the API key is in table {table}"
    fingerprints = [json.loads(path.read_text()) for path in root.rglob("fingerprint.json")]
    assert fingerprints and KEY not in json.dumps(fingerprints)


def test_offline_sft_keeps_trains_and_registers(prepared):
    from stages import sft, stats

    root = workspace_copy(prepared, "offline")
    overrides = {
        "workspace": {"path": str(root / "workspace")},
        "model": {"base": str(root / "base-model")},
        "cpt": {"max_length": 512, "eval_max_sequences": 4},
        # The thinking format, though the only model generator is the one being trained (auto would be direct).
        "answers": {"thinking": True},
        "validation": {"max_queries": 2, "max_tokens": 1024},
        "sft": {
            "generators": [
                {"kind": "retrieval", "samples": 2},
                {
                    "kind": "endpoint",
                    "samples": 1,
                    "endpoint": {"backend": "transformers", "max_tokens": 640, "seed": 0},
                },
            ],
            "judge": {"kind": "semantic"},
            "base_model": str(root / "base-model"),
            "max_queries": 16,
            "max_length": 4096,  # the tiny tokenizer (trained on shell text) spends many tokens on tool lists
            "max_steps": 2,
            "save_steps": 1,
            "tokens_per_step": 2048,
            "micro_batch_rows": 2,
        },
    }
    config = load_config(None, [overrides])
    with Store(config.workspace.database_path) as store:
        result = sft.run(config, store)
        metrics = result.metrics
        generators = dict(
            store.execute(
                "SELECT regexp_extract(generator, '^[a-z]+'), count(*) FROM sft_candidates GROUP BY ALL"
            ).fetchall()
        )
        [checkpoint] = store.rows("SELECT * FROM checkpoints WHERE stage = 'sft'")
        retention = stats.collect(store)["sft retention"]
        again = sft.run(config, store)
    assert generators == {"retrieval": 32, "transformers": 16}
    assert metrics["queries"] == 16 and 0 < metrics["kept"] <= 16
    assert metrics["retention"] == metrics["kept"] / 16
    assert retention[-1] == {
        "domain": "all",
        "queries": 16,
        "kept": metrics["kept"],
        "retention": round(metrics["kept"] / 16, 4),
        "mean_winner_score": metrics["mean_winner_score"],
        "selection": metrics["selection"],
    }
    assert metrics["global_step"] == 2 and metrics["train_sequences"] > 0
    assert metrics["eval_observation_ce_before"] > 0 and metrics["eval_observation_ce_after"] > 0
    assert (
        metrics["val_queries"] == 2
        and metrics["val_score_before"] is not None
        and metrics["answer_format"] == "thinking"
    )
    assert metrics["val_format_before"] == "non-thinking" and metrics["val_format_after"] == "thinking"
    assert Path(checkpoint["path"], "config.json").is_file()
    assert (Path(checkpoint["path"]) / "tokenizer.json").is_file()
    assert result.images["sft-score-distribution"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"sft-retention", "sft-decisions", "sft-candidates", "sft-judgements"} <= set(result.tables)
    assert again.summary.startswith("already trained")
    # Complete, so its resume checkpoints are gone (workspace.keep_resume_checkpoints false); its model is not.
    run_dir = result.images["sft-score-distribution"].parent
    assert list(run_dir.glob("trainer/checkpoint-*")) == [] and (run_dir / "model" / "model.safetensors").is_file()
    assert_labels_are_the_thinking_then_the_real_observation(config, run_dir)


def test_direct_sft_trains_on_the_real_observations_and_generates_nothing(prepared):
    """The direct format (issue 28): every chosen query is a sample whose target is the real observation
    under a drawn template asking for the direct format; no candidate is generated or judged; the
    checkpoint records its format and the validation score compares it with its start."""
    import pyarrow.parquet as pq

    from pipeline.prompts.answer_format import model_format
    from pipeline.training.models import load_tokenizer
    from stages import sft

    root = workspace_copy(prepared, "direct")
    overrides = {
        "workspace": {"path": str(root / "workspace")},
        "model": {"base": str(root / "base-model")},
        "cpt": {"max_length": 512, "eval_max_sequences": 4},
        "validation": {"max_queries": 3, "max_tokens": 1024},
        "sft": {
            "base_model": str(root / "base-model"),
            "max_queries": 6,
            "max_length": 4096,
            "max_steps": 2,
            "save_steps": 1,
            "tokens_per_step": 2048,
            "micro_batch_rows": 2,
        },
    }
    config = load_config(None, [overrides])  # auto: the only generator is the model being trained -> direct
    with Store(config.workspace.database_path) as store:
        result = sft.run(config, store)
        candidates = store.scalar("SELECT count(*) FROM sft_candidates")
        [checkpoint] = store.rows("SELECT * FROM checkpoints WHERE stage = 'sft'")
        observations = dict(
            ((r["trajectory_id"], r["turn_index"]), r["observation"])
            for r in store.rows("SELECT trajectory_id, turn_index, observation FROM turns")
        )
        domains = dict(store.execute("SELECT trajectory_id, domain FROM trajectories").fetchall())
    metrics = result.metrics
    assert candidates == 0 and metrics["answer_format"] == "direct" and metrics["kept"] == metrics["queries"] == 6
    # The summary names the model SFT started from (here sft.base_model, a local folder).
    started = Path(config.sft.base_model).name
    assert result.summary.startswith(f"from {started}, direct format: 6 queries, their real observations as targets")
    assert model_format(checkpoint["path"], "sft").name == "direct"
    assert metrics["val_queries"] == 3 and metrics["val_format_after"] == "direct"
    assert "validation score" in result.summary
    tokenizer = load_tokenizer(config.sft.base_model)
    rows = pq.read_table(Path(checkpoint["path"]).parent / "sequences" / "train.parquet").to_pylist()
    assert rows
    # Every answer of a sample is a label (sft.label_history): the target last, and before it the observations
    # of the turns just before the target that its history kept, in order, each with its end token.
    history_labels = 0
    for row in rows:
        trajectory, target = row["source"], row["turn_indices"][0]
        spans = [tokenizer.decode(span) for span in labelled_spans(row["labels"])]
        assert spans[-1] == observations[(trajectory, target)] + "<|im_end|>"
        earlier = [observations[(trajectory, i)] + "<|im_end|>" for i in range(target)]
        assert spans[:-1] == earlier[len(earlier) - len(spans) + 1 :]
        assert "<think>" not in tokenizer.decode(row["input_ids"])
        assert row["stratum"] == domains[trajectory]  # the row order balances the environments
        history_labels += sum(len(span) for span in labelled_spans(row["labels"])[:-1])
    assert metrics["history_label_tokens"] == history_labels > 0
    assert metrics["train_label_tokens"] > history_labels


def labelled_spans(labels: list[int]) -> list[list[int]]:
    """The runs of consecutive labelled positions: one per assistant answer that is a label."""
    spans: list[list[int]] = []
    for position, label in enumerate(labels):
        if label == -100:
            continue
        if position == 0 or labels[position - 1] == -100:
            spans.append([])
        spans[-1].append(label)
    return spans


def assert_labels_are_the_thinking_then_the_real_observation(config, run_dir: Path) -> None:
    """Decoded from the training file the stage wrote: each sample's labels are its assistant output
    (`<think>` block, then the reference observation) and the end token, nothing else."""
    import pyarrow.parquet as pq

    from pipeline.training.models import load_tokenizer

    tokenizer = load_tokenizer(config.sft.base_model)
    rows = pq.read_table(run_dir / "sequences" / "train.parquet").to_pylist()
    with Store(config.workspace.database_path, read_only=True) as store:
        references = {
            (row["trajectory_id"], row["turn_index"]): (row["observation"], row["thinking"])
            for row in store.rows(
                "SELECT s.trajectory_id, s.turn_index, u.observation, c.thinking FROM sft_samples s "
                "JOIN turns u USING (trajectory_id, turn_index) JOIN sft_candidates c ON c.candidate_id = s.winner "
                "WHERE s.kept"
            )
        }
    assert rows
    for row in rows:
        observation, thinking = references[(row["source"], row["turn_indices"][0])]
        labelled = [label for label in row["labels"] if label != -100]
        expected = f"<think>\n{thinking}\n</think>\n\n{observation}<|im_end|>"
        assert tokenizer.decode(labelled) == expected
        first = row["labels"].index(labelled[0])
        assert tokenizer.decode(row["input_ids"][:first]).endswith("<|im_start|>assistant\n")


def test_queries_that_cannot_fit_are_passed_over_before_generation(prepared):
    """The choice takes `max_queries` targets that can become a sample, in rank order; the tool-call
    targets, whose tool lists alone overrun short rows, are passed over and counted, and a larger
    budget still takes a superset of a smaller one's."""
    from pipeline.prompts.sft import TEMPLATES
    from pipeline.sft.queries import choose_targets, load_queries
    from pipeline.sft.samples import can_fit, shortest_prompt
    from pipeline.store.snapshot import target_turns
    from pipeline.training.models import ensure_chatml_tokens, load_tokenizer
    from pipeline.training.sequences import SequenceBuilder
    from stages import sft

    root = workspace_copy(prepared, "fit")

    def choose(max_queries: int, max_length: int):
        overrides = {
            "workspace": {"path": str(root / "workspace")},
            "model": {"base": str(root / "base-model")},
            "sft": {"base_model": str(root / "base-model"), "max_queries": max_queries, "max_length": max_length},
        }
        config = load_config(None, [overrides])
        with Store(config.workspace.database_path) as store:
            plan = sft._plan(config, store)
            tokenizer = load_tokenizer(plan.base_ref)
            queries, passed_over = sft._choose_queries(config.sft, plan, store, tokenizer)
            ranked = choose_targets(target_turns(store, "sft"), None, config.sft.seed)
            every = load_queries(plan.snapshot_dir, "sft", ranked, config.sft.max_history_chars)
        ensure_chatml_tokens(tokenizer)
        builder = SequenceBuilder(tokenizer, max_length, 0)
        fits = [
            can_fit(
                builder,
                shortest_prompt(builder, [t.render(q.domain, q.system) for t in TEMPLATES]),
                q.action,
                q.reference,
            )
            for q in every
        ]
        return queries, passed_over, every, fits

    queries, passed_over, every, fits = choose(6, 640)
    assert 0 < sum(fits) < len(every)  # this length separates the pool: some fit, some never can
    fitting = [q.query_id for q, fit in zip(every, fits) if fit]
    assert [q.query_id for q in queries] == fitting[:6]
    last = [q.query_id for q in every].index(queries[-1].query_id)
    assert passed_over == sum(1 for fit in fits[: last + 1] if not fit) > 0
    assert "mcp" in {q.domain for q, fit in zip(every, fits) if not fit}  # tool lists overrun the rows
    more, _, _, _ = choose(9, 640)
    assert [q.query_id for q in more][:6] == [q.query_id for q in queries]
    # No budget: every target that fits, and every one that does not is counted.
    everything, passed_all, _, _ = choose(None, 640)
    assert [q.query_id for q in everything] == fitting and passed_all == len(every) - len(fitting)


def refusal_with_endpoint(root: Path, answer, **sections) -> str:
    """The one line `sft.prepare` refuses with when the generator and the judge are a test server answering
    `answer(request)`: 3 queries, 2 candidates each, from the endpoint alone (the retrieval generator's
    candidates would parse, and hold no key)."""
    from pipeline.errors import UserFixableError
    from stages import sft

    with OpenAIServer(answer=answer) as server:
        config = endpoint_config(root, server, max_retries=0, **sections)
        with Store(config.workspace.database_path) as store, pytest.raises(UserFixableError) as refused:
            sft.prepare(config, store)
    return str(refused.value)


def endpoint_config(root: Path, server: OpenAIServer, max_retries: int, **sections):
    """SFT from the test server alone (generator and judge): 3 queries, 2 candidates each."""
    endpoint = {"backend": "openai", "base_url": server.base_url, "model": "test-model", "max_retries": max_retries}
    return load_config(
        None,
        [
            {
                "workspace": {"path": str(root / "workspace")},
                "model": {"base": str(root / "base-model")},
                "sft": {
                    "generators": [{"kind": "endpoint", "samples": 2, "endpoint": {**endpoint, "max_tokens": 640}}],
                    "judge": {"kind": "llm", "endpoint": endpoint},
                    "base_model": str(root / "base-model"),
                    "max_queries": 3,
                    "max_length": 1024,
                },
                **sections,
            }
        ],
    )


def test_when_every_candidate_held_the_key_the_stage_names_the_endpoint_that_echoes_it(prepared, monkeypatch):
    """Issue 29.5: every candidate refused as `held_secret`, and the stage advised lowering sft.min_score or a
    stronger generator; neither helps while the endpoint copies the Authorization header into its answers."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    def echoing(request: dict) -> str:
        if request["messages"][0]["content"].startswith(GENERATOR_OPENING):
            return f"<think>\nheaders: Authorization: Bearer {KEY}\n</think>\n\nfile.txt\n"
        return scripted_answer(request)

    message = refusal_with_endpoint(workspace_copy(prepared, "echoed"), echoing)
    assert message.startswith("sft kept none of 3 queries (no_parsed_candidate 3): 6 candidate(s) held the API key")
    assert "echoes credentials" in message and "min_score" not in message and "stronger generator" not in message
    assert KEY not in message


def test_a_judge_answering_prose_fails_the_stage_and_its_rerun_asks_again(prepared):
    """Found by probing: a judge answering prose with HTTP 200 left every query `no_valid_judgement`, the stage
    advised lowering sft.min_score, and the rerun after the judge was fixed asked nothing: the invalid judgements
    were stored as done, and the garbage cached. Now an answer that is no judgement is rejected as it arrives,
    retried, counted as a failed request, and asked again by the next run."""
    from pipeline.llm.client import EndpointFailed
    from stages import sft

    root = workspace_copy(prepared, "prose-judge")
    fixed = threading.Event()

    def judge_fixed_later(request: dict) -> str:
        system = request["messages"][0]["content"]
        if "## Criteria" in system and not fixed.is_set():
            return "A fine prediction."
        return scripted_answer(request)

    with OpenAIServer(answer=judge_fixed_later) as server:
        config = endpoint_config(
            root,
            server,
            max_retries=1,
            answers={"thinking": True},
            validation={"max_queries": 2, "max_tokens": 1024},
        )
        with Store(config.workspace.database_path) as store, pytest.raises(EndpointFailed) as failed:
            sft.prepare(config, store)
        assert "sft.judge:" in str(failed.value) and "rejected answer" in str(failed.value)
        assert "not JSON" in str(failed.value) and "min_score" not in str(failed.value)
        prose = [e for e in server.log if e.answer == "A fine prediction."]
        assert prose and len(prose) % 2 == 0  # each asked twice: the answer and its one retry

        fixed.set()
        asked_before = len(server.log)
        with Store(config.workspace.database_path) as store:
            sft.prepare(config, store)
            invalid = store.scalar("SELECT count(*) FROM judgements WHERE invalid_reason IS NOT NULL")
        judged_again = [e for e in server.log[asked_before:] if "## Criteria" in e.body["messages"][0]["content"]]
    assert invalid == 0
    assert len(judged_again) == len(prose) // 2  # every judgement that was none, asked once more; nothing else


def test_when_no_candidate_parsed_the_stage_names_the_thinking_format_not_a_threshold(prepared):
    """A generator that never writes a thinking block: every query `no_parsed_candidate`, and the stage advised
    lowering sft.min_score, which no answer that did not parse ever reaches."""

    def plain(request: dict) -> str:
        if request["messages"][0]["content"].startswith(GENERATOR_OPENING):
            return "file.txt\n"  # the observation alone: no thinking block
        return scripted_answer(request)

    message = refusal_with_endpoint(workspace_copy(prepared, "unparsed"), plain, answers={"thinking": True})
    assert message.startswith("sft kept none of 3 queries (no_parsed_candidate 3): no candidate parsed in the thinking")
    assert "rationale: true" in message and "answers.thinking: false" in message and "min_score" not in message


def test_the_summary_counts_the_queries_a_tolerated_failure_left_undecided():
    """Found by probing: a query whose request failed (under max_failed_fraction) read as not kept, and the rerun
    said "already trained" without a word of how to ask it again."""
    from stages.sft import _summary

    metrics = {"selection": "v1", "kept": 5, "queries": 6, "retention": 5 / 6, "train_sequences": 5, "global_step": 2}
    assert "undecided" not in _summary({**metrics, "undecided": 0})
    line = _summary({**metrics, "undecided": 1})
    assert "5 of 6 queries kept" in line and "; 1 undecided (a generator or judge request failed" in line
    assert "remove it and rerun to ask them again" in line


def test_the_summary_says_how_many_candidates_parsed_and_how_the_rest_failed():
    """Found by probing: 12 of 24 candidates were `unclosed_think` or `extra_think_tag`, 2 kept samples were too long
    for sft.max_length, and the line said "6 of 6 queries kept (100.0%) ... 4 samples"."""
    from stages.sft import _summary

    metrics = {"selection": "v1", "kept": 6, "queries": 6, "retention": 1.0, "train_sequences": 4, "global_step": 2}
    statuses = {"candidates.ok": 12, "candidates.unclosed_think": 8, "candidates.extra_think_tag": 4}
    line = _summary({**metrics, **statuses, "samples_too_long": 2})
    assert "; candidates parsed 12 of 24 (unclosed_think 8, extra_think_tag 4)" in line
    assert "; 2 kept samples longer than sft.max_length left out" in line
    assert "candidates parsed" not in _summary(metrics)  # a direct run generates none
