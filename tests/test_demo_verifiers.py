"""The demo corpus's verifiers (issue 11): the adapters keep them in turn metadata, each passes on
its own reference observation and fails on a plausible wrong one, in the sandbox."""

import json
import os
import re
from pathlib import Path

import pytest

from pipeline.config.sandbox import SandboxConfig
from pipeline.formats.openai_chat import Adapter as OpenAIChat
from pipeline.formats.simulacra_jsonl import Adapter as SimulacraJsonl
from pipeline.rewards.rule import rule_rewards, verifier_of
from pipeline.store.schema import RecordError

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"


def demo_turns() -> list[tuple[str, str, str]]:
    """(where, verifier, reference observation) of every demo turn with a verifier, read through
    the adapters that ingestion uses."""
    found = []
    for number, line in enumerate((DEMO / "terminal.jsonl").read_text().splitlines(), start=1):
        for index, turn in enumerate(SimulacraJsonl().parse(json.loads(line), None).turns):
            if verifier_of(turn.metadata):
                found.append((f"terminal.jsonl:{number} turn {index}", turn.metadata["verifier"], turn.observation))
    for number, conversation in enumerate(json.loads((DEMO / "tool_calls.json").read_text())):
        for index, turn in enumerate(OpenAIChat().parse(conversation, None).turns):
            if verifier_of(turn.metadata):
                found.append((f"tool_calls.json[{number}] turn {index}", turn.metadata["verifier"], turn.observation))
    return found


def plausible_wrong(observation: str) -> str:
    """What a near-miss simulator predicts: a JSON reply missing one key, a count off by one."""
    try:
        reply = json.loads(observation)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):  # a terminal's output (`9\n` reads as JSON too)
        return re.sub(r"\d+", lambda number: str(int(number.group()) + 1), observation, count=1)
    reply.pop(sorted(reply)[-1])
    return json.dumps(reply)


@pytest.fixture(scope="module")
def turns() -> list[tuple[str, str, str]]:
    return demo_turns()


def test_every_verifier_in_the_files_reaches_turn_metadata(turns):
    terminal = (DEMO / "terminal.jsonl").read_text().count('"verifier": ')
    tool = sum("verifier" in m for c in json.loads((DEMO / "tool_calls.json").read_text()) for m in c["messages"])
    kinds = {where.split(":")[0].split("[")[0] for where, _, _ in turns}
    assert len(turns) == terminal + tool and terminal > 0 and tool > 0
    assert kinds == {"terminal.jsonl", "tool_calls.json"}


def test_each_verifier_accepts_its_reference_and_rejects_a_near_miss(turns):
    """Every turn, with the verifier run directly (it is the builder's own code)."""
    for where, code, reference in turns:
        namespace: dict = {}
        exec(compile(code, where, "exec"), namespace)
        assert namespace["verify"](reference) is True, where
        assert namespace["verify"](plausible_wrong(reference)) is False, where


@pytest.mark.skipif(
    os.geteuid() != 0, reason="checked as root, as CI runs (any user works where user namespaces are allowed)"
)
def test_each_distinct_verifier_in_the_sandbox(turns):
    """Every distinct verifier code through the sandbox, on the first turn carrying it: 25 for
    the reference, 0 for the near miss."""
    first = {}
    for where, code, reference in turns:
        first.setdefault(code, (where, reference))
    codes = list(first)
    references = [first[code][1] for code in codes]
    outcomes = rule_rewards(codes * 2, references + [plausible_wrong(r) for r in references], SandboxConfig())
    verdicts = [(first[code][0], o.status) for code, o in zip(codes * 2, outcomes)]
    assert verdicts == [(first[c][0], "pass") for c in codes] + [(first[c][0], "fail") for c in codes]


def openai_chat_record(verifier: object) -> dict:
    return {
        "messages": [
            {"role": "user", "content": "How many books?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "count_books", "arguments": "{}"}}
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "name": "count_books",
                "content": '{"count": 3}',
                **({} if verifier is None else {"verifier": verifier}),
            },
            {"role": "assistant", "content": "Three."},
        ]
    }


@pytest.mark.parametrize(
    "verifier, stored, error",
    [
        ("def verify(p):\n    return True\n", "def verify(p):\n    return True\n", None),
        (None, None, None),
        (7, None, "messages[2].verifier"),
    ],
)
def test_openai_chat_tool_reply_verifier(verifier, stored, error):
    if error:
        with pytest.raises(RecordError, match=re.escape(error)):
            OpenAIChat().parse(openai_chat_record(verifier), None)
        return
    (turn,) = OpenAIChat().parse(openai_chat_record(verifier), None).turns
    assert turn.metadata.get("verifier") == stored
