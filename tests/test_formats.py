"""Format adapters read real trajectories the way ingest does: detect on a file's first document,
split documents into records, parse each record or quarantine it with the reason.

Public files (../shared/data/public) pin values read off the files themselves; hand-written
fixtures (tests/fixtures/formats) cover the formats without a public sample and malformed input.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config.filter import FilterConfig
from pipeline.config.ingest import FieldMapping
from pipeline.filters import build_rules
from pipeline.formats import adapter, detect
from pipeline.formats.base import Malformed, iter_documents
from pipeline.formats.domains import domain_of_tools
from pipeline.store.schema import RecordError, Trajectory

PUBLIC = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "public"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "formats"
NO_PUBLIC = f"public trajectories not found at {PUBLIC} (the repo's sibling shared/data/public)"


def needs_public(test):
    """A test that reads the public trajectories, skipped where they are absent."""
    return pytest.mark.public_data(pytest.mark.skipif(not PUBLIC.is_dir(), reason=NO_PUBLIC)(test))


@dataclass
class Read:
    adapter: str | None
    trajectories: list[Trajectory]
    quarantined: dict[str, str]  # location -> reason


def read(path: Path, format_name: str | None = None, **options) -> Read:
    """One file through detection (or a named adapter), record splitting and parsing."""
    chosen = adapter(format_name, **options) if format_name else None
    trajectories, quarantined = [], {}
    for document in iter_documents(path):
        if isinstance(document, Malformed):
            quarantined[document.location] = document.error
            continue
        chosen = chosen or detect(document.content)
        assert chosen is not None, f"no adapter detected {document.location}"
        for record in chosen.records(document):
            try:
                trajectories.append(chosen.parse(record.content, None))
            except (RecordError, KeyError, TypeError, ValueError) as exc:
                quarantined[record.location] = str(exc)
    return Read(chosen.name if chosen else None, trajectories, quarantined)


@dataclass
class Case:
    path: str  # under PUBLIC, or "fixtures/<name>"
    adapter: str
    trajectories: int
    quarantined: int
    first_turns: int
    turn: int  # which turn of the first trajectory to spot-check
    action: str  # that turn's action; one ending in "…" is a prefix of it
    observation: str  # a prefix of that turn's observation
    tool_name: str | None
    domain: str


CASES = [
    Case(
        "tau_bench/gpt-4o-airline-tasks-00-24.json",
        "openai-chat",
        85,
        15,
        8,
        0,
        '{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}',
        '{"name": {"first_name": "Mia", "last_name": "Li"}',
        "get_user_details",
        "mcp",
    ),
    Case(
        "agentbench_alfworld/alfworld_multiturn_pure.json",
        "openai-chat",
        6,
        0,
        6,
        0,
        '{"name": "take_action", "arguments": {"action": "go to cabinet 1"}}',
        "On the cabinet 1, you see a cloth 1, a soapbar 1, a soapbottle 1.",
        "take_action",
        "text-game",
    ),
    Case(
        "agentbench_alfworld/alfworld_multiturn_react.json",
        "openai-chat",
        6,
        0,
        6,
        2,
        '{"name": "take_action", "arguments": {"action": "open cabinet 2"}}',
        "You open the cabinet 2. The cabinet 2 is open. In it, you see a candle 1, and a spraybottle 2.",
        "take_action",
        "text-game",
    ),
    Case(
        "mini_swe_agent/github_issue.traj.json",
        "mini-swe-agent",
        1,
        0,
        10,
        1,
        "ls -la",
        "<returncode>0</returncode>\n<output>\ntotal 44\n",
        "bash",
        "swe",
    ),
    Case(
        "openhands/basic.json",
        "openhands",
        1,
        0,
        1,
        0,
        '{"name": "str_replace_editor", "arguments": {"command": "create", "file_text": "import random\\nimport keyboard…',
        "--- /workspace/game_2048.py\n+++ /workspace/game_2048.py\n",
        "str_replace_editor",
        "swe",
    ),
    Case(
        "react_alfworld/alfworld_3prompts.json",
        "text-game",
        36,
        0,
        10,
        2,
        "go to cabinet 1",
        "On the cabinet 1, you see a cloth 1, a soapbar 1, a soapbottle 1.",
        None,
        "text-game",
    ),
    Case(
        "swe_agent/demonstrations/function_calling_simple.traj",
        "swe-agent",
        1,
        0,
        5,
        0,
        "find_file missing_colon.py",
        'Found 1 matches for "missing_colon.py" in /SWE-agent__test-repo:',
        "find_file",
        "swe",
    ),
    Case(
        "swe_agent/demonstrations/ctf/rev/rock.traj",
        "swe-agent",
        1,
        0,
        12,
        0,
        "./rock\n",
        "\nEXECUTION TIMED OUT",
        "bash",
        "swe",
    ),
    Case(
        "swe_agent/demonstrations/replay__marshmallow-code__marshmallow-1867__function_calling__install-1/"
        "marshmallow-code__marshmallow-1867.traj",
        "swe-agent",
        1,
        0,
        11,
        2,
        "python reproduce.py",
        "344",
        "bash",
        "swe",
    ),
    Case(
        "fixtures/atif_terminal.json",
        "atif",
        1,
        0,
        4,
        0,
        '{"name": "bash_command", "arguments": {"duration": 0.1, "keystrokes": "pwd\\n"}}',
        "/app\nroot@4e1f0c2b9a7d:/app# ",
        "bash_command",
        "terminal",
    ),
    Case(
        "fixtures/sharegpt_agent.jsonl",
        "sharegpt",
        3,
        0,
        1,
        0,
        "bash\n\n```bash\nls -1 /etc/*.conf | wc -l\n```",
        "The output of the OS:\n\n27",
        None,
        "terminal",
    ),
    Case(
        "fixtures/textworld_log.txt",
        "text-game",
        1,
        0,
        4,
        2,
        "go east",
        "-= Pantry =-\nYou are in a pantry.",
        None,
        "text-game",
    ),
    Case(
        "fixtures/openai_chat_mixed.jsonl",
        "openai-chat",
        1,
        6,
        2,
        1,
        '{"name": "read_file", "arguments": {"path": "/project/README.md"}}',
        "# demo\n\nInstall with `pip install -e .`",
        "read_file",
        "mcp",
    ),
]


def _case_param(case: Case):
    if case.path.startswith("fixtures/"):
        return pytest.param(case, id=case.path)
    marks = [pytest.mark.public_data, pytest.mark.skipif(not PUBLIC.is_dir(), reason=NO_PUBLIC)]
    return pytest.param(case, id=case.path, marks=marks)


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_file_reads_into_expected_trajectories(case: Case):
    path = FIXTURES / case.path.removeprefix("fixtures/") if case.path.startswith("fixtures/") else PUBLIC / case.path
    result = read(path)
    assert result.adapter == case.adapter
    assert (len(result.trajectories), len(result.quarantined)) == (case.trajectories, case.quarantined)
    first = result.trajectories[0]
    assert len(first.turns) == case.first_turns
    turn = first.turns[case.turn]
    if case.action.endswith("…"):
        assert turn.action.startswith(case.action[:-1])
    else:
        assert turn.action == case.action
    assert turn.observation.startswith(case.observation)
    assert turn.tool_name == case.tool_name
    assert first.domain == case.domain
    assert first.format == case.adapter and first.source == ""


# Turns per trajectory of every SWE-agent demonstration, counted from each file's `trajectory`
# (or `history` for function_calling_simple.traj).
SWE_AGENT_TURNS = {
    "ctf/crypto/BabyEncryption.traj": 16,
    "ctf/crypto/BabyTimeCapsule.traj": 9,
    "ctf/crypto/eps.traj": 14,
    "ctf/crypto/katy.traj": 18,
    "ctf/forensics/flash.traj": 4,
    "ctf/misc/networking_1.traj": 4,
    "ctf/pwn/warmup.traj": 7,
    "ctf/rev/rock.traj": 12,
    "ctf/web/i_got_id_demo.traj": 21,
    "function_calling_simple.traj": 5,
    "human_thought__swe-bench-HumanEvalFix-python__lcb__t-0.00__p-0.95__c-4.00__install-0/humanevalfix-python-0.traj": 5,
    "replay__marshmallow-code__marshmallow-1867__default__t-0.20__p-0.95__c-2.00__install-1___install_from_source/"
    "marshmallow-code__marshmallow-1867.traj": 14,
    "replay__marshmallow-code__marshmallow-1867__default_sys-env_cursors_window100__t-0.20__p-0.95__c-2.00__install-1/"
    "marshmallow-code__marshmallow-1867.traj": 12,
    "replay__marshmallow-code__marshmallow-1867__default_sys-env_window100__t-0.20__p-0.95__c-2.00__install-1/"
    "marshmallow-code__marshmallow-1867.traj": 11,
    "replay__marshmallow-code__marshmallow-1867__function_calling__install-1/marshmallow-code__marshmallow-1867.traj": 11,
    "replay__marshmallow-code__marshmallow-1867__function_calling_replace__install-1/"
    "marshmallow-code__marshmallow-1867.traj": 11,
    "replay__marshmallow-code__marshmallow-1867__function_calling_replace_from_source/"
    "marshmallow-code__marshmallow-1867.traj": 13,
    "replay__marshmallow-code__marshmallow-1867__xml_sys-env_cursors_window100__t-0.20__p-0.95__c-2.00__install-1/"
    "marshmallow-code__marshmallow-1867.traj": 12,
    "replay__marshmallow-code__marshmallow-1867__xml_sys-env_window100__t-0.20__p-0.95__c-2.00__install-1/"
    "marshmallow-code__marshmallow-1867.traj": 11,
}


@needs_public
def test_every_swe_agent_demonstration_parses():
    folder = PUBLIC / "swe_agent" / "demonstrations"
    found = {str(p.relative_to(folder)) for p in folder.rglob("*.traj")}
    assert found == set(SWE_AGENT_TURNS), "a demonstration was added or removed: pin its turn count"
    for name, turns in SWE_AGENT_TURNS.items():
        result = read(folder / name)
        assert (result.adapter, result.quarantined) == ("swe-agent", {}), name
        (trajectory,) = result.trajectories
        assert len(trajectory.turns) == turns, name
        assert trajectory.system.action_space and trajectory.task, name


@needs_public
def test_a_replayed_swe_agent_run_records_the_instance_it_solved():
    """Eight configurations' runs of one SWE-bench instance sat in four split groups (their task texts, the issue in
    each configuration's instructions, differ), some in cpt and some in sft, one in eval at another salt with 4 of its
    5 targets verbatim in training. Where the file records the instance (`replay_config.problem_statement.id`), the
    run carries it as `metadata.instance_id`, the split's group before the task text."""
    folder = PUBLIC / "swe_agent" / "demonstrations"
    instances = {}
    for path in folder.glob("replay__marshmallow-code__marshmallow-1867__*/*.traj"):
        (trajectory,) = read(path).trajectories
        recorded = "replay_config" in json.loads(path.read_text())
        instances[path.parent.name] = (recorded, trajectory.metadata.get("instance_id"))
    assert len(instances) == 8
    assert {instance for recorded, instance in instances.values() if recorded} == {"marshmallow-code__marshmallow-1867"}
    assert {instance for recorded, instance in instances.values() if not recorded} == {None}


@needs_public
def test_conversation_without_environment_actions_is_quarantined():
    path = PUBLIC / "openhands" / "basic_interactions.json"
    result = read(path)
    assert result.trajectories == []
    assert result.quarantined == {str(path): "no environment actions: 6 events, skipped actions: 1 finish, 4 message"}


@needs_public
def test_tau_bench_runs_keep_reward_policy_and_skipped_chat():
    result = read(PUBLIC / "tau_bench" / "gpt-4o-airline-tasks-00-24.json")
    first = result.trajectories[0]
    assert first.task == "Hi! I'm looking to book a flight from New York to Seattle on May 20th."
    assert first.outcome_reward == 0.0
    assert (first.metadata["task_id"], first.metadata["trial"]) == (0, 0)
    assert first.metadata["agent_system_prompt"].startswith("# Airline Agent Policy")
    # 7 assistant replies to the simulated user and 7 later user messages are not environment turns.
    assert (first.metadata["assistant_messages_skipped"], first.metadata["user_messages_skipped"]) == (7, 7)
    assert sum(len(t.turns) for t in result.trajectories) == 621  # every tool call of the file, answered
    # The agent's `think` tool answers "" every time: 58 thoughts, history but never targets (issue 13).
    thoughts = [u for t in result.trajectories for u in t.turns if u.metadata.get("kind") == "thought"]
    assert len(thoughts) == 58 and {(u.tool_name, u.observation) for u in thoughts} == {("think", "")}
    # The 15 runs where the agent only talked to the user have nothing for a world model.
    assert all(r.startswith("no environment actions:") for r in result.quarantined.values())
    # 31 runs of the file succeed; 2 of them by talking only, and those are among the quarantined.
    assert sum(t.outcome_reward for t in result.trajectories) == 29


@needs_public
def test_agentbench_first_message_is_the_initial_state():
    first = read(PUBLIC / "agentbench_alfworld" / "alfworld_multiturn_pure.json").trajectories[0]
    assert first.task == "put some spraybottle on toilet."
    assert first.system.initial_state.startswith("You are in the middle of a room.")
    assert first.turns[0].metadata["thought"].startswith("The task is to put some spraybottle on toilet")
    # The closing "Task succeeded." call has no tool response: skipped and counted.
    assert first.metadata["unanswered_actions"] == 1


@needs_public
def test_react_think_actions_are_thought_turns():
    """A `think:` action is answered by the harness, not the game: a turn (history for the next
    action) of kind `thought`, which no stage makes a target (issue 13)."""
    first = read(PUBLIC / "react_alfworld" / "alfworld_3prompts.json").trajectories[0]
    assert first.task == "put some spraybottle on toilet."
    assert [t.tool_name for t in first.turns[:3]] == ["think", "think", None]
    assert [t.metadata.get("kind") for t in first.turns[:3]] == ["thought", "thought", None]
    assert first.turns[0].observation == "OK."
    # The few-shot log prints nothing after some thoughts: kept, with the empty observation it shows.
    assert first.turns[5].action.startswith("think: Now I find a spraybottle") and first.turns[5].observation == ""


@needs_public
def test_mini_swe_agent_return_codes_mark_errors():
    (trajectory,) = read(PUBLIC / "mini_swe_agent" / "github_issue.traj.json").trajectories
    assert [t.metadata.get("returncode") for t in trajectory.turns] == [1, 0, 0, 0, 0, 0, 0, 1, 0, None]
    assert [t.is_error for t in trajectory.turns] == [True] + [False] * 6 + [True, False, False]
    assert trajectory.turns[0].observation.startswith("<returncode>1</returncode>\n<output>\ncat: ")
    assert trajectory.task.startswith("Please solve this issue: GitHub Issue: SyntaxError")


@needs_public
def test_swe_agent_system_prompt_is_the_action_space():
    folder = PUBLIC / "swe_agent" / "demonstrations"
    (trajectory,) = read(folder / "ctf" / "rev" / "rock.traj").trajectories
    assert "COMMANDS:" in trajectory.system.action_space
    assert trajectory.metadata["exit_status"] == "submitted"
    assert [t.tool_name for t in trajectory.turns[:3]] == ["bash", "decompile", "decompile"]
    assert trajectory.turns[0].metadata["state"]["open_file"] == "n/a"  # the JSON string the old format wrote, parsed
    assert trajectory.task.startswith("We're currently solving the following CTF challenge.")


def test_atif_pairs_results_by_call_id_then_order():
    (trajectory,) = read(FIXTURES / "atif_terminal.json").trajectories
    assert trajectory.task.startswith("Create a file called hello.txt in /app")
    # Results listed out of order are matched by source_call_id; the result without one by order.
    assert trajectory.turns[1].observation.startswith("total 8\n")
    assert trajectory.turns[2].action.endswith('"keystrokes": "printf \'Hello, world!\\\\n\' > /app/hello.txt\\n"}}')
    assert trajectory.turns[2].observation == "root@4e1f0c2b9a7d:/app# "
    assert trajectory.turns[0].metadata["thought"].startswith("The task needs /app/hello.txt.")
    # The final mark_task_complete call has no result: the run ends there, skipped and counted.
    assert trajectory.metadata["unanswered_actions"] == 1
    assert trajectory.metadata["agent_system_prompt"].startswith("You are an AI assistant")
    assert trajectory.metadata["agent"] == {"name": "terminus-2", "version": "2.0.0", "model_name": "claude-sonnet-4-5"}


def test_sharegpt_reply_with_an_action_is_not_an_acknowledgement():
    """Issue 13: a short first reply starting "Sure" that acts is the first turn, not an
    acknowledgement: before, that turn vanished and the task became the next observation."""
    trajectory = adapter("sharegpt").parse(
        {
            "id": "os_7",
            "conversations": [
                {"from": "human", "value": "How many .conf files are directly inside /etc?"},
                {"from": "gpt", "value": "Sure, I will count them. Act: bash ls /etc/*.conf | wc -l"},
                {"from": "human", "value": "The output of the OS:\n27"},
                {"from": "gpt", "value": "Act: answer(27)"},
            ],
        },
        None,
    )
    assert trajectory.task == "How many .conf files are directly inside /etc?"
    assert [(t.action, t.observation) for t in trajectory.turns] == [
        ("bash ls /etc/*.conf | wc -l", "The output of the OS:\n27")
    ]
    assert trajectory.turns[0].metadata["thought"] == "Sure, I will count them."
    assert (trajectory.metadata["assistant_messages_skipped"], trajectory.metadata["unanswered_actions"]) == (0, 1)
    assert "agent_system_prompt" not in trajectory.metadata


def _atif(*steps):
    return {
        "schema_version": "ATIF-v1.5",
        "session_id": "s",
        "agent": {"name": "terminus-2"},
        "steps": [{"source": "user", "message": "Create /app/hello.txt."}, *steps],
    }


def _keys(call_id, keystrokes):
    return {
        "tool_call_id": call_id,
        "function_name": "bash_command",
        "arguments": {"keystrokes": keystrokes, "duration": 0.1},
    }


REJECTED = (
    "Previous response had parsing errors:\nERROR: Missing required fields: analysis, plan\n"
    "WARNINGS: - Extra text detected before JSON object\n\nPlease fix these issues and provide a proper JSON response."
)


def test_atif_reply_the_harness_could_not_parse_is_a_format_error_turn():
    """Issue 8: Terminus-2 records a reply that is not its JSON schema as an agent step with no tool
    call, the raw reply as message and its complaint as observation (Harbor's golden
    hello-world-invalid-json.trajectory.json has this shape), then asks again. That step never
    reached the terminal: a format-error turn, which the filter drops as a retry cycle."""
    trajectory = adapter("atif").parse(
        _atif(
            {
                "source": "agent",
                "message": "I will write the file.\n{\n",
                "observation": {"results": [{"content": REJECTED}]},
            },
            {
                "source": "agent",
                "message": "Analysis: retry.",
                "tool_calls": [_keys("call_1_1", "echo hi > hello.txt\n")],
                "observation": {
                    "results": [{"content": "New Terminal Output:\n\nroot@c0ffee:/app# echo hi > hello.txt\n"}]
                },
            },
            {
                "source": "agent",
                "message": "Verify.",
                "tool_calls": [_keys("call_2_1", "cat hello.txt\n")],
                "observation": {
                    "results": [{"content": "New Terminal Output:\n\nroot@c0ffee:/app# cat hello.txt\nhi\n"}]
                },
            },
        ),
        None,
    )
    rejected, retry, check = trajectory.turns
    assert (rejected.action, rejected.is_error, rejected.metadata["kind"]) == (
        "I will write the file.\n{\n",
        True,
        "format_error",
    )
    assert (retry.is_error, retry.tool_name, retry.metadata.get("kind")) == (False, "bash_command", None)
    verdict = build_rules(FilterConfig()).judge(trajectory)
    assert (verdict.kept, verdict.kept_turns) == (True, [1, 2])
    assert [(index, rule) for index, rule, _ in verdict.turn_drops] == [(0, "retry_cycle")]
    assert verdict.turn_drops[0][2] == "format error retried at turn 1"


def test_atif_reply_warnings_are_not_the_terminal_answer():
    """Terminus-2 runs a reply that parsed with warnings and writes them before the terminal's
    answer; the world model would learn to print a parser's complaint that no terminal prints."""
    trajectory = adapter("atif").parse(
        _atif(
            {
                "source": "agent",
                "message": "List it.",
                "tool_calls": [_keys("call_0_1", "ls\n")],
                "observation": {
                    "results": [
                        {
                            "content": "Previous response had warnings:\nWARNINGS: - Extra text detected "
                            "before JSON object\n- Extra text detected after JSON object\n\n"
                            "New Terminal Output:\n\nroot@c0ffee:/app# ls\nhello.txt\n"
                        }
                    ]
                },
            }
        ),
        None,
    )
    (turn,) = trajectory.turns
    assert turn.observation == "New Terminal Output:\n\nroot@c0ffee:/app# ls\nhello.txt\n"
    assert turn.metadata["reply_warnings"] == (
        "WARNINGS: - Extra text detected before JSON object\n- Extra text detected after JSON object"
    )


def test_atif_message_without_calls_answered_by_the_terminal_is_an_action():
    """Terminus-2's `raw_content` mode and OpenHands without function calling record every step
    without tool calls (Harbor's golden trajectories): the message is the action, not an error."""
    raw = '{"analysis": "Empty.", "plan": "List it.", "commands": [{"keystrokes": "ls\\n", "duration": 0.1}]}'
    trajectory = adapter("atif").parse(
        _atif({"source": "agent", "message": raw, "observation": {"results": [{"content": "root@c0ffee:/app# ls\n"}]}}),
        None,
    )
    (turn,) = trajectory.turns
    assert (turn.action, turn.is_error, turn.metadata) == (raw, False, {})


def test_atif_keystrokes_sharing_one_answer_are_one_turn():
    """Terminus-2 sends several keystrokes in one step and writes the terminal's answer once, with
    no `source_call_id` (it applies to the whole step). Read call by call, the second call had no
    result and the run was quarantined as a hole before the next step."""
    trajectory = adapter("atif").parse(
        _atif(
            {
                "source": "agent",
                "message": "Write and show it.",
                "tool_calls": [
                    _keys("call_0_1", "echo hi > hello.txt\n"),
                    _keys("call_0_2", "cat hello.txt\n"),
                    {"tool_call_id": "call_0_task_complete", "function_name": "mark_task_complete", "arguments": {}},
                ],
                "observation": {
                    "results": [
                        {"content": "root@c0ffee:/app# echo hi > hello.txt\nroot@c0ffee:/app# cat hello.txt\nhi\n"}
                    ]
                },
            },
            {
                "source": "agent",
                "message": "Done.",
                "tool_calls": [
                    {"tool_call_id": "call_1_task_complete", "function_name": "mark_task_complete", "arguments": {}}
                ],
                "observation": {"results": [{"content": "New Terminal Output:\n\n"}]},
            },
        ),
        None,
    )
    both, done = trajectory.turns
    assert both.action.splitlines() == [
        '{"name": "bash_command", "arguments": {"duration": 0.1, "keystrokes": "echo hi > hello.txt\\n"}}',
        '{"name": "bash_command", "arguments": {"duration": 0.1, "keystrokes": "cat hello.txt\\n"}}',
        '{"name": "mark_task_complete", "arguments": {}}',
    ]
    assert (both.tool_name, both.metadata["calls"], both.observation.endswith("hi\n")) == (None, 3, True)
    assert (done.tool_name, trajectory.metadata["unanswered_actions"]) == ("mark_task_complete", 0)


def test_sharegpt_acknowledgement_moves_instructions_out_of_the_task():
    os_run, webshop, weather = read(FIXTURES / "sharegpt_agent.jsonl").trajectories
    assert os_run.task == "How many files with the .conf suffix are directly inside /etc?"
    assert os_run.metadata["agent_system_prompt"].startswith("You are an assistant that will act like a person")
    assert os_run.turns[0].metadata["thought"].startswith("Think: I list the .conf files")
    assert os_run.metadata["unanswered_actions"] == 1  # the final answer(27)
    assert webshop.domain == "web" and webshop.task.startswith("WebShop [SEP] Instruction:")
    assert [t.action for t in webshop.turns] == [
        "search[long sleeve men's shirt navy]",
        "click[B09QQP3356]",
        "click[Buy Now]",
    ]
    assert webshop.turns[0].observation.startswith("Instruction: [SEP] i need")  # "Observation:" stripped
    assert weather.domain == "other" and weather.task == "What is the weather in Paris right now?"
    assert (
        weather.turns[0].action
        == '{"name": "get_current_weather", "arguments": {"location": "Paris, FR", "unit": "celsius"}}'
    )
    assert weather.turns[0].tool_name == "get_current_weather"


def test_sharegpt_json_list_is_one_record_per_conversation(tmp_path):
    lines = (FIXTURES / "sharegpt_agent.jsonl").read_text().splitlines()
    path = tmp_path / "agentinstruct.json"
    path.write_text("[" + ",".join(lines) + ', {"conversations": [{"from": "gpt", "value": "hi"}]}]')
    result = read(path)
    assert len(result.trajectories) == 3
    assert result.quarantined == {
        f"{path}[3]": "conversations: expected the first non-system message to be the human's task"
    }


def test_text_game_log_initial_state_and_turns():
    (trajectory,) = read(FIXTURES / "textworld_log.txt").trajectories
    assert trajectory.system.initial_state.startswith("-= Welcome to TextWorld =-")
    assert trajectory.system.initial_state.endswith("There is an exit to the east.")
    assert trajectory.task is None  # TextWorld states its goal in prose, without a task line
    assert [t.action for t in trajectory.turns] == [
        "inventory",
        "take red key from shelf",
        "go east",
        "unlock chest with red key",
    ]
    assert trajectory.turns[3].observation == "You unlock the chest.\n\nYour score has just gone up by one point."


QUARANTINED_LINES = {
    2: "messages[1].tool_calls[0].function.arguments: not valid JSON",
    3: "messages[1].tool_calls[0]: no tool response before messages[2]",
    4: "messages[0].role: expected a string, got int",
    5: "messages[2].tool_call_id: 'call_9' answers no open tool call",
    6: "invalid JSON",
    7: "messages[1].tool_calls[0].function.arguments: expected a JSON object, got JSON list",
}


def test_malformed_chat_lines_are_quarantined_with_their_reason():
    path = FIXTURES / "openai_chat_mixed.jsonl"
    result = read(path)
    assert set(result.quarantined) == {f"{path}:{line}" for line in QUARANTINED_LINES}
    for line, fragment in QUARANTINED_LINES.items():
        assert fragment in result.quarantined[f"{path}:{line}"]
    (good,) = result.trajectories
    assert good.system.tool_names() == {"read_file", "list_directory"}
    assert good.metadata["assistant_messages_skipped"] == 1


def _chat(*messages):
    return {"messages": list(messages)}


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


MALFORMED = [
    ("openai-chat", "not a chat", "expected a message list or an object with `messages` or `traj`, got str"),
    (
        "openai-chat",
        _chat({"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": {"id": "x"}}),
        "messages[1].tool_calls: expected a list, got dict",
    ),
    (
        "openai-chat",
        _chat({"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [_call("a", 7, "{}")]}),
        "messages[1].tool_calls[0].function.name: expected a string, got int",
    ),
    (
        "openai-chat",
        _chat({"role": "user", "content": "hi"}, {"role": "narrator", "content": "..."}),
        "messages[1].role: unknown role 'narrator'",
    ),
    (
        "openai-chat",
        _chat({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}),
        "no environment actions: 2 messages",
    ),
    ("openai-chat", {"traj": [], "reward": "1"}, "reward: expected a number, got str"),
    ("openai-chat", {"messages": [], "tools": ["read_file"]}, "tools: expected a list of tool schemas"),
    ("openai-chat", {"messages": [], "tools": "[{'name': 'f'}]"}, "tools: a string that is not JSON"),
    (
        "sharegpt",
        {"conversations": [{"from": "human", "value": "go"}, {"from": "gpt", "value": 3}]},
        "conversations[1].value: expected a string, got int",
    ),
    (
        "sharegpt",
        {
            "conversations": [
                {"from": "human", "value": "go"},
                {"from": "gpt", "value": "a"},
                {"from": "gpt", "value": "b"},
            ]
        },
        "conversations[2]: two agent messages in a row",
    ),
    (
        "sharegpt",
        {
            "conversations": [
                {"from": "human", "value": "go"},
                {"from": "function_call", "value": '{"name": "f", "arguments": "{oops"}'},
            ]
        },
        "conversations[1].value.arguments: not valid JSON",
    ),
    (
        "swe-agent",
        {"trajectory": [{"action": "ls", "observation": None}], "history": []},
        "trajectory[0].observation: expected a string, got NoneType",
    ),
    (
        "swe-agent",
        {"trajectory": [], "history": [{"role": "system", "content": "x"}]},
        "no environment actions: neither `trajectory` steps nor actions in `history`",
    ),
    ("openhands", [{"id": 1, "action": "run", "args": "ls"}], "events[0].args: expected an object, got str"),
    (
        "openhands",
        [{"id": 0, "source": "user", "action": "message", "args": {"content": "hi"}}],
        "no environment actions: 1 events, skipped actions: none",
    ),
    (
        "mini-swe-agent",
        [
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": "```bash\nls\n```"},
            {"role": "assistant", "content": "```bash\npwd\n```"},
        ],
        "messages[2]: a second assistant message before any observation",
    ),
    (
        "mini-swe-agent",
        {"messages": [{"role": "user", "content": "task"}, {"role": "robot", "content": "x"}]},
        "messages[1].role: unknown role 'robot'",
    ),
    (
        "atif",
        {
            "schema_version": "ATIF-v1.4",
            "steps": [
                {
                    "source": "agent",
                    "message": "m",
                    "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": 5}],
                }
            ],
        },
        "steps[0].tool_calls[0].arguments: expected a JSON object or a JSON string, got int",
    ),
    (
        "atif",
        {
            "schema_version": "ATIF-v1.4",
            "steps": [
                {
                    "source": "agent",
                    "message": "m",
                    "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {}}],
                },
                {
                    "source": "agent",
                    "message": "n",
                    "tool_calls": [{"tool_call_id": "c2", "function_name": "bash", "arguments": {}}],
                    "observation": {"results": [{"source_call_id": "c2", "content": "ok"}]},
                },
            ],
        },
        "steps[0].tool_calls[0]: a tool call without an observation result, before later actions",
    ),
    # Issue 13: within one step too, a call without a result before an answered one is a hole.
    (
        "atif",
        {
            "schema_version": "ATIF-v1.4",
            "steps": [
                {
                    "source": "agent",
                    "message": "m",
                    "tool_calls": [
                        {"tool_call_id": "c1", "function_name": "bash", "arguments": {}},
                        {"tool_call_id": "c2", "function_name": "bash", "arguments": {}},
                    ],
                    "observation": {"results": [{"source_call_id": "c2", "content": "ok"}]},
                }
            ],
        },
        "steps[0].tool_calls[0]: a tool call without an observation result, before later actions",
    ),
    (
        "atif",
        {"schema_version": "ATIF-v1.4", "steps": [{"source": "robot", "message": "m"}]},
        "steps[0].source: expected one of agent, system, user, got 'robot'",
    ),
    (
        "atif",
        {
            "schema_version": "ATIF-v1.4",
            "steps": [
                {
                    "source": "agent",
                    "message": "m",
                    "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {}}],
                    "observation": {"results": [{"content": 3}]},
                }
            ],
        },
        "steps[0].observation.results[0].content: expected a string, got int",
    ),
    ("text-game", "You are in a room.\nNo actions here.", "no `> action` lines"),
    ("text-game", "> look\nA room.", "no initial observation before the first `> action` line"),
    ("text-game", ["> look"], "expected the text of a game log, got list"),
]


@pytest.mark.parametrize(("format_name", "record", "reason"), MALFORMED, ids=[m[2][:50] for m in MALFORMED])
def test_malformed_record_raises_record_error_naming_the_field(format_name, record, reason):
    with pytest.raises(RecordError) as raised:
        adapter(format_name).parse(record, None)
    assert reason in str(raised.value)


MINI_SWE_LIST = [
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "THOUGHT: look.\n\n```mswea_bash_command\nls\n```"},
    {"role": "user", "content": "<returncode>0</returncode>\n<output>\na.py\n</output>"},
]
DETECTION = [
    ("mini-swe-agent list, not a generic chat", MINI_SWE_LIST, "mini-swe-agent"),
    ("plain chat", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "openai-chat"),
    ("messages object", {"messages": [{"role": "user", "content": "hi"}]}, "openai-chat"),
    ("AgentBench keyed", {"put": [{"role": "user", "content": "hi"}]}, "openai-chat"),
    ("ATIF", {"schema_version": "ATIF-v1.2", "session_id": "s", "steps": []}, "atif"),
    ("ShareGPT", {"conversations": [{"from": "human", "value": "hi"}]}, "sharegpt"),
    ("text-game log", "West of House\nYou are standing in an open field.\n> open mailbox\nOpened.", "text-game"),
    ("prose with a quote is not a game", "Dear team,\nplease read the notes.\n", None),
    ("a game line needs text before it", "> look\nA dark room.", None),
    ("a dict with one non-log value", {"a": "Room.\n> look\nDark.", "b": "just text"}, None),
    ("any other JSON", {"id": 3, "text": "hello"}, None),
]


@pytest.mark.parametrize(("_", "content", "expected"), DETECTION, ids=[d[0] for d in DETECTION])
def test_detection_picks_the_most_specific_adapter(_, content, expected):
    found = detect(content)
    assert (found.name if found else None) == expected


MAPPING = FieldMapping(
    turns="steps",
    action="cmd",
    observation="out",
    tool_name="tool",
    task="run.goal",
    system_prompt="prompt",
    outcome_reward="score",
    id="run.id",
)


def test_generic_jsonl_follows_the_field_mapping():
    path = FIXTURES / "generic_runs.jsonl"
    result = read(path, "generic-jsonl", mapping=MAPPING)
    first, second = result.trajectories
    assert (first.task, first.outcome_reward, first.metadata) == (
        "Find the largest file in /var/log",
        1.0,
        {"id": "run-001"},
    )
    assert first.system.task_description == "You simulate an Ubuntu 22.04 shell."
    assert [(t.action, t.observation, t.tool_name) for t in first.turns] == [
        ("ls -S /var/log | head -1", "syslog\n", "shell"),
        ("du -h /var/log/syslog", "14M\t/var/log/syslog\n", "shell"),
    ]
    assert first.domain == "other"
    # A structured observation is rendered as JSON; a turn without the mapped tool field has none.
    assert (second.turns[0].observation, second.turns[0].tool_name) == (
        '{"exit": 0, "stdout": "5.15.0-91-generic\\n"}',
        None,
    )
    assert result.quarantined == {f"{path}:3": "steps[0].out: missing (mapped field not in the record)"}


def test_generic_jsonl_is_never_detected_and_needs_a_mapping():
    record = json.loads((FIXTURES / "generic_runs.jsonl").read_text().splitlines()[0])
    assert detect(record) is None
    with pytest.raises(ValueError, match="field_mapping"):
        adapter("generic-jsonl")
    with pytest.raises(RecordError, match="run.goal: missing"):
        adapter("generic-jsonl", mapping=MAPPING).parse(
            {"steps": [], "score": 1, "prompt": "p", "run": {"id": "r"}}, None
        )


def test_source_domain_overrides_inference():
    (trajectory,) = read(FIXTURES / "atif_terminal.json").trajectories
    record = json.loads((FIXTURES / "atif_terminal.json").read_text())
    assert trajectory.domain == "terminal"
    assert adapter("atif").parse(record, "swe").domain == "swe"


def test_argument_order_does_not_change_the_trajectory():
    def run(arguments):
        return adapter("openai-chat").parse(
            _chat(
                {"role": "user", "content": "book it"},
                {"role": "assistant", "tool_calls": [_call("c", "book", arguments)]},
                {"role": "tool", "tool_call_id": "c", "content": "booked"},
            ),
            None,
        )

    assert run('{"from": "JFK", "to": "SEA"}').content_id() == run('{"to": "SEA", "from": "JFK"}').content_id()


def test_plain_chat_alternates_assistant_action_and_user_observation():
    trajectory = adapter("openai-chat").parse(
        [
            {"role": "system", "content": "You are a shell agent."},
            {"role": "user", "content": "What is in the current folder?"},
            {"role": "assistant", "content": "ls"},
            {"role": "user", "content": "a.txt"},
            {"role": "assistant", "content": "cat a.txt"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "It holds a.txt, which says hello."},
        ],
        None,
    )
    assert [(t.action, t.observation) for t in trajectory.turns] == [("ls", "a.txt"), ("cat a.txt", "hello")]
    assert (trajectory.domain, trajectory.task) == ("other", "What is in the current folder?")
    assert trajectory.metadata["agent_system_prompt"] == "You are a shell agent."
    assert trajectory.metadata["unanswered_actions"] == 1  # the closing summary


def test_unanswered_call_at_the_end_is_skipped_not_quarantined():
    trajectory = adapter("openai-chat").parse(
        _chat(
            {"role": "user", "content": "cancel my booking"},
            {"role": "assistant", "tool_calls": [_call("a", "get_booking", '{"id": "B1"}')]},
            {"role": "tool", "tool_call_id": "a", "content": '{"status": "active"}'},
            {"role": "assistant", "tool_calls": [_call("b", "cancel_booking", '{"id": "B1"}')]},
            {"role": "assistant", "content": "Your booking is being cancelled."},
        ),
        None,
    )
    assert [t.tool_name for t in trajectory.turns] == ["get_booking"]
    assert (trajectory.metadata["unanswered_actions"], trajectory.metadata["assistant_messages_skipped"]) == (1, 1)


def test_mini_swe_agent_format_error_is_a_flagged_turn():
    trajectory = adapter("mini-swe-agent").parse(
        MINI_SWE_LIST[:1]
        + [
            {"role": "assistant", "content": "Two at once:\n```bash\nls\n```\n```bash\npwd\n```"},
            {
                "role": "user",
                "content": "Please always provide EXACTLY ONE action in triple backticks, found 2 actions.",
            },
        ]
        + MINI_SWE_LIST[1:],
        None,
    )
    failed, retry = trajectory.turns
    assert (failed.is_error, failed.tool_name, failed.metadata["kind"]) == (True, None, "format_error")
    assert failed.observation.startswith("Please always provide EXACTLY ONE action")
    assert (retry.action, retry.is_error, retry.metadata["returncode"]) == ("ls", False, 0)


@needs_public
def test_openhands_evaluation_output_wraps_events_in_history():
    events = json.loads((PUBLIC / "openhands" / "basic.json").read_text())
    record = {"instance_id": "demo__2048-1", "history": events}
    assert detect(record).name == "openhands"
    trajectory = adapter("openhands").parse(record, None)
    assert (len(trajectory.turns), trajectory.metadata["instance_id"]) == (1, "demo__2048-1")


def test_openhands_think_action_is_a_thought():
    """OpenHands does not run a `think` action; it answers "Your thought has been logged." itself
    (runtime/base.py): a thought, kept as history, never a target (issue 13)."""
    trajectory = adapter("openhands").parse(
        [
            {"id": 0, "source": "user", "action": "message", "args": {"content": "Fix the failing test."}},
            {"id": 1, "source": "agent", "action": "think", "args": {"thought": "The test imports a removed helper."}},
            {
                "id": 2,
                "source": "agent",
                "observation": "think",
                "cause": 1,
                "content": "Your thought has been logged.",
            },
            {"id": 3, "source": "agent", "action": "run", "args": {"command": "pytest -x"}},
            {
                "id": 4,
                "source": "agent",
                "observation": "run",
                "cause": 3,
                "content": "1 passed",
                "extras": {"metadata": {"exit_code": 0}},
            },
        ],
        None,
    )
    think, run = trajectory.turns
    assert (think.tool_name, think.observation, think.metadata["kind"]) == (
        "think",
        "Your thought has been logged.",
        "thought",
    )
    assert (run.action, run.metadata.get("kind")) == ("pytest -x", None)


def test_legacy_function_call_is_answered_by_the_function_message():
    trajectory = adapter("openai-chat").parse(
        [
            {"role": "user", "content": "weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            {"role": "function", "name": "get_weather", "content": "-3 C, snow"},
        ],
        None,
    )
    assert [(t.action, t.observation) for t in trajectory.turns] == [
        ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', "-3 C, snow")
    ]


def test_reused_call_ids_pair_in_order():
    trajectory = adapter("openai-chat").parse(
        _chat(
            {"role": "user", "content": "You are in the middle of a room.\nYour task is to: look."},
            {"role": "agent", "tool_calls": [_call("same", "take_action", '{"action": "look"}')]},
            {"role": "tool", "tool_call_id": "same", "content": "first"},
            {"role": "agent", "tool_calls": [_call("same", "take_action", '{"action": "inventory"}')]},
            {"role": "tool", "tool_call_id": "same", "content": "second"},
        ),
        None,
    )
    assert [t.observation for t in trajectory.turns] == ["first", "second"]
    assert (trajectory.domain, trajectory.task) == ("text-game", "look.")


DOMAINS_BY_TOOLS = [
    (["execute_bash", "str_replace_editor"], "swe"),  # an editor makes it SWE even among shell calls
    (["bash"], "terminal"),
    (["bash_command"], "terminal"),
    (["browser_click", "browser_type"], "web"),
    (["web_search", "python_execute"], "search"),
    (["search_direct_flight", "get_user_details"], "mcp"),  # an airline API's search is not a search engine
    (["adb_tap"], "android"),
    ([], "mcp"),
]


@pytest.mark.parametrize(
    ("tools", "domain"), DOMAINS_BY_TOOLS, ids=[",".join(t) or "none" for t, _ in DOMAINS_BY_TOOLS]
)
def test_domain_from_signature_tools(tools, domain):
    assert domain_of_tools(tools, "mcp") == domain
