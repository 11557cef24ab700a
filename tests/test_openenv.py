"""`simulacra openenv` (issue 19, deliver 3: "the environment served over HTTP/WebSocket as OpenEnv
clients expect", tested with OpenEnv itself): a tiny world model served by `simulacra serve`, the
OpenEnv server over it in a second process, both on 127.0.0.1, driven by OpenEnv's own clients.

- OpenEnv's EnvClient (typed: WorldModelEnvClient; and its GenericEnvClient, plain dicts) over the
  WebSocket: reset shows the initial state, a seed replays an episode, step returns the observation,
  reward and done as OpenEnv defines them; the episode's ends (success pattern, sandboxed verifier,
  step limit) as a table.
- Errors in OpenEnv's shapes, the session still usable after each: a malformed action is a
  VALIDATION_ERROR (422 over HTTP), a misspelt reset field, a step before reset or after the end an
  EXECUTION_ERROR (400 / 409 over HTTP), never a 500.
- Concurrent sessions keep their own episodes; one past --max-sessions is OpenEnv's CAPACITY_REACHED.
- The command: one line and exit status 2 for what the user fixes, OpenEnv missing included.
"""

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline.config.model import TinyModelConfig
from pipeline.serving.export_folder import write_export
from pipeline.serving.prompt_formats import prompt_format
from pipeline.training.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
EPISODE = {
    "task": "Count the lines of notes.txt.",
    "action_space": "bash commands, one per action",
    "initial_state": "~/notes.txt holds three lines.",
    "max_steps": 3,
}
ACTIONS = ("ls", "cat notes.txt", "wc -l notes.txt")
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _started(command: list[str], ready_url: str):
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *command],
        cwd=REPO,
        env=SUBPROCESS_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    while True:
        try:
            httpx.get(ready_url, timeout=2).raise_for_status()
            return process
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"{' '.join(command[:1])} did not start:\n{process.stdout.read()}")
            time.sleep(0.5)


def _stop(process) -> None:
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def world_model(tmp_path_factory):
    """The tiny random model, exported and served by `simulacra serve`: its /v1 URL."""
    root = tmp_path_factory.mktemp("openenv")
    model = build_tiny_model(
        TinyModelConfig(max_position_embeddings=512), [REPO / "data/demo/terminal.jsonl"], root / "tiny"
    )
    folder = write_export(
        model,
        root / "export",
        prompt_format("cpt"),
        {"model_name": "world-model-test", "fingerprint": "test", "context_length": 512, "max_history_chars": 24_000},
        "# card\n",
    )
    port = _free_port()
    process = _started(
        ["serve", str(folder), "--port", str(port), "--max-tokens", "8"], f"http://127.0.0.1:{port}/health"
    )
    yield f"http://127.0.0.1:{port}/v1"
    _stop(process)


@pytest.fixture(scope="module")
def server(world_model, tmp_path_factory):
    """`simulacra openenv` over it, with a default episode (a step limit of 3) and room for two sessions."""
    episode = tmp_path_factory.mktemp("episode") / "episode.yaml"
    episode.write_text(yaml.safe_dump(EPISODE))
    port = _free_port()
    process = _started(
        [
            "openenv",
            "--world-model",
            world_model,
            "--domain",
            "terminal",
            "--episode",
            str(episode),
            "--port",
            str(port),
            "--max-tokens",
            "6",
            "--max-sessions",
            "2",
        ],
        f"http://127.0.0.1:{port}/health",
    )
    yield f"http://127.0.0.1:{port}"
    _stop(process)


def test_a_seed_replays_an_episode_and_steps_are_openenv_results(server):
    from pipeline.serving.openenv_env import WorldModelAction, WorldModelEnvClient

    with WorldModelEnvClient(base_url=server).sync() as env:

        def episode(seed):
            start = env.reset(seed=seed)
            assert (start.observation.text, start.reward, start.done) == (EPISODE["initial_state"], None, False)
            return [env.step(WorldModelAction(action=action)) for action in ACTIONS]

        first = episode(3)
        texts = [result.observation.text for result in first]
        assert [result.observation.text for result in episode(3)] == texts  # sampled at temperature 1, replayed
        assert [result.observation.text for result in episode(4)] != texts
        # The episode file's step limit: reward 0.0 each step, done at the third, truncated says why.
        assert [(r.reward, r.done, r.observation.truncated) for r in first] == [
            (0.0, False, False),
            (0.0, False, False),
            (0.0, True, True),
        ]
        assert [result.observation.history_sent for result in first] == [0, 1, 2]
        assert first[-1].observation.reason.startswith("the step limit of 3 was reached")

        episode(3)
        state = env.state()
        assert (state.task, state.seed, state.step_count, state.done) == (EPISODE["task"], 3, 3, True)
        assert [turn["action"] for turn in state.turns] == list(ACTIONS)
        assert [turn["observation"] for turn in state.turns] == texts


ALWAYS = "def verify(observation):\n    return isinstance(observation, str)\n"
NEVER = "def verify(observation):\n    return False\n"


@pytest.mark.parametrize(
    "ends, expected",
    [
        ({"success_pattern": "^"}, [(1.0, True)]),  # matches any observation
        ({"verifier": ALWAYS}, [(1.0, True)]),  # run in the rule reward's sandbox
        ({"verifier": NEVER, "max_steps": 2}, [(0.0, False), (0.0, True)]),
        ({"success_pattern": "(?!)"}, [(0.0, False)] * 4),  # never matches, no limit: never done
    ],
)
def test_the_episode_ends_as_reset_says(server, ends, expected):
    """OpenEnv's own dict client: the episode given to reset replaces the server's (its step limit too)."""
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=server).sync() as env:
        env.reset(seed=0, task="Find the config file.", **ends)
        results = [env.step({"action": "ls"}) for _ in expected]
        assert [(result.reward, result.done) for result in results] == expected, results[-1].observation["reason"]
        assert results[-1].observation["truncated"] is (ends.get("max_steps") is not None)


def _refused(call, code: str, *named: str) -> None:
    with pytest.raises(RuntimeError) as refused:
        call()
    assert f"(code: {code})" in str(refused.value)
    for name in named:
        assert name in str(refused.value)


def test_bad_requests_are_openenv_errors_over_the_websocket(server):
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=server).sync() as env:
        _refused(lambda: env.step({"action": "ls"}), "EXECUTION_ERROR", "no episode: reset first")
        env.reset(seed=1)
        _refused(lambda: env.step({"action": ""}), "VALIDATION_ERROR")
        _refused(lambda: env.step({"command": "ls"}), "VALIDATION_ERROR")
        _refused(lambda: env.step({"action": ["ls"]}), "VALIDATION_ERROR")
        _refused(lambda: env.reset(task="t", sucess_pattern="3"), "EXECUTION_ERROR", "sucess_pattern")
        _refused(lambda: env.reset(task="t", success_pattern="("), "EXECUTION_ERROR", "not a regular expression")
        _refused(lambda: env.reset(task="t", max_steps="three"), "EXECUTION_ERROR", "three")
        env.reset(seed=1, task="t", success_pattern="^")
        assert env.step({"action": "ls"}).done
        _refused(lambda: env.step({"action": "ls"}), "EXECUTION_ERROR", "the episode is over")
        assert env.reset(seed=1).observation["text"] == EPISODE["initial_state"]  # the session lives on
        assert env.step({"action": "ls", "control_instructions": ["inject an intermittent API error"]}).reward == 0.0


@pytest.mark.parametrize(
    "path, body, status, named",
    [
        ("/step", {"action": {"action": ""}}, 422, "string_too_short"),
        ("/step", {"action": {"action": "ls", "shell": "bash"}}, 422, "extra_forbidden"),
        ("/step", {"action": {"action": "ls"}}, 409, "WebSocket"),  # HTTP is stateless in OpenEnv
        ("/reset", {"seed": 1, "sucess_pattern": "3"}, 400, "sucess_pattern"),
        ("/reset", {"seed": 1, "task": "t", "success_pattern": "["}, 400, "not a regular expression"),
        # Each was taken: a list asked as its repr, a mapping a 500, 2.7 steps as 2, a string's letters as tools.
        ("/reset", {"task": ["count the notes"]}, 400, "`task` must be text, not list"),
        ("/reset", {"task": "t", "initial_state": {"notes.txt": 3}}, 400, "`initial_state` must be text, not dict"),
        ("/reset", {"task": "t", "max_steps": 2.7}, 400, "`max_steps` must be a whole number, not 2.7"),
        ("/reset", {"task": "t", "tools": "lookup"}, 400, "`tools` must be a list of tool schemas"),
    ],
)
def test_bad_requests_are_4xx_over_http(server, path, body, status, named):
    answer = httpx.post(server + path, json=body, timeout=60)
    assert answer.status_code == status, answer.text
    assert named in answer.text


def test_http_routes_describe_the_environment(server):
    reset = httpx.post(server + "/reset", json={"seed": 5}, timeout=60).json()
    assert reset["observation"]["text"] == EPISODE["initial_state"] and reset["done"] is False
    schema = httpx.get(server + "/schema", timeout=10).json()
    assert schema["action"]["required"] == ["action"]
    assert {"text", "thinking", "truncated", "reason", "history_sent"} <= set(schema["observation"]["properties"])
    assert {"task", "seed", "turns"} <= set(schema["state"]["properties"])
    assert httpx.get(server + "/metadata", timeout=10).json()["name"] == "simulacra_world_model"


def test_concurrent_sessions_keep_their_own_episodes(server):
    from pipeline.serving.openenv_env import WorldModelAction, WorldModelEnvClient

    async def episode(env, seed, actions):
        await env.reset(seed=seed)
        for action in actions:
            await env.step(WorldModelAction(action=action))
        return await env.state()

    async def main():
        async with WorldModelEnvClient(base_url=server) as first, WorldModelEnvClient(base_url=server) as second:
            states = await asyncio.gather(episode(first, 1, ["ls", "pwd"]), episode(second, 2, ["whoami"]))
            third = WorldModelEnvClient(base_url=server)
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):  # --max-sessions 2
                await third.reset()
            await third.close()
            return states

    first, second = asyncio.run(main())
    assert [turn["action"] for turn in first.turns] == ["ls", "pwd"] and first.seed == 1
    assert [turn["action"] for turn in second.turns] == ["whoami"] and second.seed == 2


def _command(arguments: list[str], cwd: Path, hidden: str | None = None) -> subprocess.CompletedProcess:
    """`simulacra openenv ARGUMENTS`; with `hidden`, that module cannot be imported in the process."""
    prelude = f"import sys; sys.modules[{hidden!r}] = None; " if hidden else ""
    code = prelude + f"from pipeline.cli import app; app({['openenv', *arguments]!r}, prog_name='simulacra')"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**SUBPROCESS_ENV, "COLUMNS": "300"},
        timeout=120,
    )


@pytest.mark.parametrize(
    "episode, arguments, message",
    [
        (None, ["--domain", "shell"], "openenv: unknown domain `shell`: --domain is one of terminal"),
        ({"task": "t", "max_step": 3}, [], "openenv: {episode}: unknown episode field(s) max_step"),
        ({"action_space": "bash"}, [], "openenv: {episode} is not a mapping of episode fields with a `task`"),
        (None, ["--world-model", "http://127.0.0.1:9/v1"], "openenv: no world model answers at http://127.0.0.1:9/v1"),
        # Was PyYAML's five lines, a caret among them; and a limit below 1 ended every step as truncated.
        (
            "task: [unclosed\n",
            [],
            "openenv: cannot read the episode {episode}: not valid YAML at line 2, column 1: expected ',' or ']'",
        ),
        ({"task": "t", "max_steps": 0}, [], "openenv: {episode}: max_steps is 0: an episode takes at least 1 step"),
    ],
)
def test_the_command_refuses_with_one_line(tmp_path, episode, arguments, message):
    """Before OpenEnv's server is imported (gradio with it, seconds): where it cannot be, the refusal is the same."""
    path = tmp_path / "episode.yaml"
    if episode is not None:
        path.write_text(episode if isinstance(episode, str) else yaml.safe_dump(episode))
        arguments = [*arguments, "--episode", str(path)]
    completed = _command(["--domain", "terminal", *arguments], tmp_path, hidden="openenv.core.env_server")
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.strip().startswith(message.format(episode=path)), completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1


def test_without_openenv_the_command_names_the_extra(tmp_path):
    completed = _command(["--domain", "terminal"], tmp_path, hidden="openenv")
    assert completed.returncode == 2, completed.stderr
    assert (
        completed.stderr.strip() == "openenv: OpenEnv is not installed (no module `openenv`): pip install '.[openenv]'"
    )


def test_a_port_in_use_is_refused_in_one_line_before_the_world_model_is_asked(tmp_path):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        completed = _command(["--domain", "terminal", "--port", str(port)], tmp_path)
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.strip() == (
        f"openenv: port {port} on 127.0.0.1 is in use by another process: stop it, or pass another --port"
    )


@pytest.mark.parametrize("given, steps", [(3, 3), (3.0, 3), ("3", 3), (None, None)])
def test_a_step_limit_is_read_as_json_yaml_and_dataset_columns_give_a_whole_number(given, steps):
    from pipeline.serving.episode import EpisodeSpec

    assert EpisodeSpec.from_mapping({"task": "t", "max_steps": given}).max_steps == steps
