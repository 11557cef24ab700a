"""Records built to break a reader, read by the real ingest stage into a real store: each is quarantined with
its reason, or kept with what JSON can hold, and the run goes on with every count conserved. Nesting deep enough
to exhaust Python's recursion, values JSON cannot write in a harness's metadata, a YAML alias bomb, a `.json`
file that is JSON Lines or JSON cut short."""

import json

import yaml

from pipeline.formats.simulacra_jsonl import to_record
from pipeline.store.schema import SystemPrompt, Trajectory, Turn
from stages import ingest


def _trajectory(n: int) -> dict:
    turns = [Turn(action=f"echo {n}", observation=f"{n}\n"), Turn(action="pwd", observation="/root\n")]
    return to_record(Trajectory(source="", domain="terminal", task=f"task {n}", system=SystemPrompt(), turns=turns))


def _conserved(result) -> None:
    metrics = result.metrics
    assert metrics["records_read"] == metrics["added"] + metrics["duplicates"] + metrics["quarantined"]


def _chat(arguments: str, tool_output) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "You are a bookstore support agent."},
            {"role": "user", "content": "Is Dune in stock?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search_books", "arguments": arguments}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": tool_output},
            {"role": "assistant", "content": "Yes."},
        ]
    }


def test_nesting_past_pythons_recursion_limit_quarantines_the_record_and_the_run_goes_on(config, store, tmp_path):
    """A tool call's arguments 5,000 brackets deep (`json.loads` of the string) and a tool answer 960 levels deep
    (rendered as text by `json.dumps`) each raised RecursionError through the whole run."""
    deep_arguments = '{"q": ' + "[" * 5000 + "]" * 5000 + "}"
    path = tmp_path / "chats.jsonl"
    lines = [_chat('{"title": "Dune"}', "3 copies"), _chat(deep_arguments, "x"), _chat("{}", "-")]
    # The stdlib's encoder stops at Python's recursion limit where orjson reads on: write the deep line by hand.
    path.write_text("\n".join(json.dumps(line) for line in lines[:2]) + "\n" + _deep_json_line(lines[2]) + "\n")

    result = ingest.run(config, store, paths=[str(path)])

    assert (result.metrics["added"], result.metrics["quarantined"]) == (1, 2)
    _conserved(result)
    reasons = [row["error"] for row in store.rows("SELECT error FROM quarantine ORDER BY location")]
    assert all(reason.startswith("nested too deeply to read") for reason in reasons), reasons


def _deep_json_line(chat: dict) -> str:
    """`chat`'s line with its tool answer replaced by one 960 levels deep (its first three messages, then that)."""
    text = json.dumps({**chat, "messages": chat["messages"][:3]})[:-2]
    depth, leaf = 480, '"found"'  # 960 levels: within orjson's 1,024, past the recursion of `json.dumps`
    content = '{"a": [' * depth + leaf + "]}" * depth
    return (
        text
        + f', {{"role": "tool", "tool_call_id": "c1", "content": {content}}}, '
        + ('{"role": "assistant", "content": "Yes."}]}')
    )


def test_metadata_json_cannot_write_is_kept_as_text_not_a_failed_batch(config, store, tmp_path):
    """A harness's metadata goes to the store as JSON: an integer past 64 bits (a return code as read), a YAML set
    or bytes are kept as text, where the write failed the whole batch before."""
    swe = tmp_path / "demo.yaml"  # SWE-agent's YAML
    swe.write_text(
        "environment: swe_main\nhistory:\n  - role: system\n    content: SETTING\ntrajectory:\n"
        "  - action: ls\n    observation: notes.txt\n    state: !!set {cwd: null}\n"
        "  - action: wc -l notes.txt\n    observation: 3 notes.txt\n    execution_time: !!binary aGVsbG8=\n"
    )
    mini = tmp_path / "mini.traj.json"  # mini-SWE-agent: the return code read as an integer
    mini.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "fix"},
                    {"role": "assistant", "content": "T\n```bash\nls\n```"},
                    {
                        "role": "user",
                        "content": "<returncode>99999999999999999999999</returncode>\n<output>\nx\n</output>",
                    },
                ]
            }
        )
    )

    result = ingest.run(config, store, paths=[str(swe), str(mini)])

    assert (result.metrics["added"], result.metrics["quarantined"]) == (2, 0), result.summary
    _conserved(result)
    stored = [
        json.loads(row["metadata"]) for row in store.rows("SELECT metadata FROM turns WHERE metadata IS NOT NULL")
    ]
    assert any(m.get("state") == ["cwd"] for m in stored), stored
    assert any(m.get("execution_time") == "hello" for m in stored), stored
    assert any(m.get("returncode") == "99999999999999999999999" for m in stored), stored


def test_a_yaml_alias_bomb_is_quarantined_before_anything_expands_it(config, store, tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\ntrajectory:\n  - action: ls\n    observation: *a9\n")
    assert bomb.stat().st_size < 1000
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(_trajectory(1)) + "\n")

    result = ingest.run(config, store, paths=[str(bomb), str(good)])

    assert (result.metrics["added"], result.metrics["quarantined"]) == (1, 1)
    _conserved(result)
    assert "aliases expand to more than" in store.scalar("SELECT error FROM quarantine")
    # A YAML that shares a value (an anchor and its alias) is read as ever.
    record = _trajectory(2)
    record["turns"][1] = record["turns"][0]
    shared = tmp_path / "shared.yaml"
    shared.write_text(yaml.safe_dump(record))
    assert "*id001" in shared.read_text()
    assert ingest.run(config, store, paths=[str(shared)]).metrics["added"] == 1


def test_a_json_file_holding_json_lines_is_read_line_by_line(config, store, tmp_path):
    path = tmp_path / "runs.json"  # as many datasets name their JSON Lines
    path.write_text("\n".join([json.dumps(_trajectory(1)), "{not json", json.dumps(_trajectory(2))]) + "\n")

    result = ingest.run(config, store, paths=[str(path)])

    assert (result.metrics["added"], result.metrics["quarantined"]) == (2, 1)
    _conserved(result)
    assert store.scalar("SELECT location FROM quarantine") == f"{path}:2"


def test_a_json_file_cut_short_names_its_json_error_and_the_fix(config, store, tmp_path):
    whole = json.dumps([_trajectory(1), _trajectory(2)])
    path = tmp_path / "runs.json"
    path.write_text(whole[: len(whole) // 2])

    result = ingest.run(config, store, paths=[str(path)])

    assert result.metrics["quarantined"] == 1
    reason = store.scalar("SELECT error FROM quarantine")
    assert reason.startswith("invalid JSON: unexpected end of data"), reason
    assert reason.endswith("no format adapter recognises it as text; fix the file or pass --format")
