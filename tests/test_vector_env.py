"""Episodes at scale (issue 31, deliver 4): `WorldModelVectorEnv` against a real `simulacra serve` on 127.0.0.1
over the tiny model taught one thinking answer (tests/served_world_model.py).

- gymnasium's vector conventions, checked as `check_env` checks a single environment (it has no vector
  counterpart): the spaces, what reset and step return and their shapes, infos as arrays with `_key` masks,
  seeded resets that repeat, the autoreset mode in the metadata, bad arguments refused naming what is wrong.
- Each sub-environment's episodes are `WorldModelEnv`'s with the same seed and actions, sampled at temperature 1,
  over an autoreset too.
- A step's requests are in flight together: the server decodes them in one batch (/health's largest batch, on a
  server of its own: one episode at a time never passes 1).
- A sub-episode that succeeds (the taught answer against a success pattern) is reset at the next step while the
  others go on, and gymnasium's own `RecordEpisodeStatistics` reads its return and length right.
- Reset gives each sub-environment its own episode, or resets only the ones `reset_mask` marks.
- A failed request truncates its own sub-episode and no other; a step whose every request fails raises.
- The example on docs/serving.md runs; bench/fidelity.py's two ways see the same observations.
"""

import importlib.util
import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline.config import load_config, parse_override
from pipeline.config.fidelity import ENVIRONMENTS, FidelityConfig
from pipeline.serving.environment import ContextExhausted
from pipeline.serving.episode import EpisodeSpec
from pipeline.serving.gym_env import TextOf, WorldModelEnv
from pipeline.serving.vector_env import WorldModelVectorEnv
from pipeline.store.schema import SystemPrompt
from tests.served_world_model import MODEL_NAME, SYSTEM, TURNS, serve_folder, taught_export

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

COUNT_LINES = EpisodeSpec(
    SYSTEM.task_description,
    SystemPrompt(action_space=SYSTEM.action_space, initial_state=SYSTEM.initial_state),
    success_pattern=r"^3 notes",
)
# Three different episodes: one that the step limit ends after two steps (so it is autoreset within a run).
EPISODES = [
    EpisodeSpec(SYSTEM.task_description, SystemPrompt(initial_state=SYSTEM.initial_state), max_steps=2),
    EpisodeSpec("Find the largest log file.", SystemPrompt(action_space="bash", initial_state="logs/ holds 3 files")),
    EpisodeSpec("Say hello."),
]
# A step's actions for each sub-environment, one row a step (the ended episode's third action is ignored).
ACTIONS = [
    ("ls", "ls -1 logs", "echo hello"),
    ("cat notes.txt", "du -b logs/*", "echo hi"),
    ("ignored: autoreset", "sort -n sizes", "printf hello"),
    ("wc -l notes.txt", "tail -3 logs/api.log", "echo bye"),
]
# Too long for the tiny model's context of 512 tokens even with no history: the request fails (ContextExhausted).
UNANSWERABLE = "cat " + "notes.txt " * 400


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return taught_export(tmp_path_factory.mktemp("vector"))


@pytest.fixture(scope="module")
def server(folder):
    yield from serve_folder(folder)


@pytest.fixture
def own_server(folder):
    """A server for one test, its /health counters its own."""
    yield from serve_folder(folder)


def vector(server: str, episodes, **options) -> WorldModelVectorEnv:
    return WorldModelVectorEnv(server, MODEL_NAME, "terminal", episodes, **{"max_tokens": 8, **options})


def health(server: str) -> dict:
    return httpx.get(server.removesuffix("/v1") + "/health").json()


def test_spaces_returns_and_seeds_follow_gymnasium_vector_conventions(server):
    from gymnasium.spaces import Tuple
    from gymnasium.utils.passive_env_checker import check_action_space, check_observation_space
    from gymnasium.vector import AutoresetMode, VectorEnv

    envs = vector(server, EPISODES, max_action_chars=24, render_mode="ansi")
    single = WorldModelEnv(server, MODEL_NAME, "terminal", EPISODES[0], max_action_chars=24)
    assert isinstance(envs, VectorEnv) and envs.num_envs == 3
    assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert envs.single_observation_space == single.observation_space
    assert envs.single_action_space == single.action_space and isinstance(envs.single_action_space, TextOf)
    for space, one in (
        (envs.observation_space, envs.single_observation_space),
        (envs.action_space, single.action_space),
    ):
        assert isinstance(space, Tuple) and list(space.spaces) == [one] * 3
    check_observation_space(envs.single_observation_space)
    check_action_space(envs.single_action_space)

    observations, infos = envs.reset(seed=123)
    assert observations in envs.observation_space
    assert observations == (SYSTEM.initial_state, "logs/ holds 3 files", "")
    assert list(infos["task"]) == [episode.task for episode in EPISODES] and infos["_task"].all()

    envs.action_space.seed(0)
    actions = envs.action_space.sample()
    assert actions in envs.action_space
    observations, rewards, terminated, truncated, infos = envs.step(actions)
    assert isinstance(observations, tuple) and observations in envs.observation_space
    for array, dtype in ((rewards, np.float64), (terminated, np.bool_), (truncated, np.bool_)):
        assert isinstance(array, np.ndarray) and array.shape == (3,) and array.dtype == dtype
    for key in ("thinking", "reason", "history_sent", "steps"):
        assert len(infos[key]) == 3 and infos[f"_{key}"].all(), key
    assert list(infos["steps"]) == [1, 1, 1]
    rendered = envs.render()
    assert isinstance(rendered, tuple) and rendered[0].startswith(f"task: {SYSTEM.task_description}\n> ")

    def seeded_step(seed):
        first, _ = envs.reset(seed=seed)
        return first, envs.step(actions)[0]

    assert seeded_step(7) == seeded_step(7)  # sampled at temperature 1, repeated
    assert seeded_step([7, 8, 9]) == seeded_step(7)  # an int seeds sub-environment i with seed + i
    assert seeded_step(8)[1] != seeded_step(7)[1]
    envs.close()
    envs.close()  # a second close is harmless, as gymnasium asks
    assert envs.closed


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda envs: envs.step(["ls", "ls"]), "2 actions for 3 sub-environments"),
        (lambda envs: envs.reset(seed=[1, 2]), "2 seeds for 3 sub-environments"),
        (lambda envs: envs.reset(options={"episodes": [{"task": "a"}]}), "1 episodes for 3 sub-environments"),
        (lambda envs: envs.reset(options={"episodes": [None] * 3, "task": "a"}), "also episode fields .*task"),
        (lambda envs: envs.reset(options={"reset_mask": np.array([1, 0, 1])}), "must be 3 booleans"),
        (lambda envs: envs.reset(options={"reset_mask": np.array([True, False])}), "must be 3 booleans"),
    ],
    ids=["actions", "seeds", "episodes", "episodes and fields", "mask of ints", "short mask"],
)
def test_bad_arguments_are_refused_naming_what_is_wrong(server, call, message):
    envs = vector(server, EPISODES)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=message):
        call(envs)
    envs.close()


def single_episodes(server: str, episode: EpisodeSpec, seed: int, actions: list[str]) -> list[tuple]:
    """What one `WorldModelEnv` returns for `actions` from a reset with `seed`, resetting (without a seed) the step
    after an episode ends, as gymnasium's next-step autoreset does."""
    env = WorldModelEnv(server, MODEL_NAME, "terminal", episode, max_tokens=8)
    observation, info = env.reset(seed=seed)
    returned: list[tuple] = [(observation, info["task"])]
    ended = False
    for action in actions:
        if ended:
            observation, info = env.reset()
            returned.append((observation, 0.0, False, False, info["task"]))
            ended = False
            continue
        observation, reward, terminated, truncated, info = env.step(action)
        returned.append((observation, reward, terminated, truncated, info["reason"], info["thinking"]))
        ended = terminated or truncated
    return returned


def test_each_sub_environment_is_the_single_environment_with_its_seed(server):
    envs = vector(server, EPISODES)
    observations, infos = envs.reset(seed=[11, 12, 13])
    returned: list[list[tuple]] = [[(observations[i], infos["task"][i])] for i in range(3)]
    for actions in ACTIONS:
        observations, rewards, terminated, truncated, infos = envs.step(actions)
        for i in range(3):
            if infos.get("_task", np.zeros(3, bool))[i]:  # autoreset
                returned[i].append((observations[i], rewards[i], terminated[i], truncated[i], infos["task"][i]))
            else:
                row = (observations[i], rewards[i], terminated[i], truncated[i], infos["reason"][i])
                returned[i].append((*row, infos["thinking"][i]))
    envs.close()
    assert [row[3] for row in returned[0][1:]] == [False, True, False, False]  # ended at its limit, then reset
    for i, (episode, seed) in enumerate(zip(EPISODES, (11, 12, 13))):
        assert returned[i] == single_episodes(server, episode, seed, [row[i] for row in ACTIONS]), i


def test_a_steps_requests_are_decoded_together(own_server):
    """On a server of its own (its largest batch is a high-water mark): one episode at a time never batches more
    than one row; one vector step of six sub-environments does."""
    server = own_server
    single = WorldModelEnv(server, MODEL_NAME, "terminal", EPISODES[1], max_tokens=40)
    single.reset(seed=0)
    for action in ("ls", "ls -1 logs"):
        single.step(action)
    assert health(server)["largest_batch"] == 1
    envs = WorldModelVectorEnv(server, MODEL_NAME, "terminal", [EPISODES[1]] * 6, max_tokens=40)
    envs.reset(seed=0)
    envs.step(["ls -1 logs"] * 6)
    assert health(server)["largest_batch"] >= 2
    envs.close()


def test_an_ended_sub_episode_is_autoreset_while_the_others_go_on(server):
    """The first sub-environment, given the trajectory the model was taught, gets the taught answer: its success
    pattern ends the episode with reward 1; the next step resets it (its action ignored) and steps the others."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    envs = RecordEpisodeStatistics(
        vector(server, [COUNT_LINES, EPISODES[1], EPISODES[2]], max_tokens=40, temperature=0)
    )
    envs.reset(seed=0)
    envs.unwrapped.envs[0].simulator.history = list(TURNS)  # the trajectory the model was taught to answer

    observations, rewards, terminated, truncated, infos = envs.step(["wc -l notes.txt", "ls", "echo hi"])
    assert observations[0] == "3 notes.txt" and infos["thinking"][0] == "Three lines."
    assert (list(rewards), list(terminated), list(truncated)) == ([1.0, 0.0, 0.0], [True, False, False], [False] * 3)
    assert "matches '^3 notes'" in infos["reason"][0]
    assert list(infos["_episode"]) == [True, False, False]
    assert (infos["episode"]["r"][0], infos["episode"]["l"][0]) == (1.0, 1)

    observations, rewards, terminated, truncated, infos = envs.step(["ignored", "ls -1 logs", "echo bye"])
    assert observations[0] == SYSTEM.initial_state and (rewards[0], terminated[0], truncated[0]) == (0.0, False, False)
    assert list(infos["_task"]) == [True, False, False] and infos["task"][0] == SYSTEM.task_description
    assert list(infos["_steps"]) == [False, True, True] and list(infos["steps"][1:]) == [2, 2]
    histories = [env.simulator.history for env in envs.unwrapped.envs]
    assert [len(history) for history in histories] == [0, 2, 2]
    assert [action for action, _ in histories[1]] == ["ls", "ls -1 logs"]

    observations, rewards, terminated, truncated, infos = envs.step(["ls", "du logs", "echo again"])
    assert list(infos["steps"]) == [1, 3, 3] and infos["_steps"].all()  # the new episode's first step
    envs.close()


def test_reset_gives_each_sub_environment_its_episode_or_only_those_masked(server):
    envs = vector(server, EPISODES)
    episodes = [
        {"task": "a", "initial_state": "state a"},
        EpisodeSpec("b", SystemPrompt(initial_state="state b")),
        None,
    ]
    observations, infos = envs.reset(seed=0, options={"episodes": episodes})
    assert observations == ("state a", "state b", "")  # None kept the third's episode (no initial state)
    assert list(infos["task"]) == ["a", "b", "Say hello."]
    stepped, *_ = envs.step(["ls", "ls", "ls"])

    mask = np.array([False, True, False])
    again = [None, {"task": "c", "initial_state": "state c"}, None]
    observations, infos = envs.reset(seed=[None, 5, None], options={"episodes": again, "reset_mask": mask})
    assert observations == (stepped[0], "state c", stepped[2])
    assert list(infos["_task"]) == [False, True, False] and infos["task"][1] == "c"
    assert [len(env.simulator.history) for env in envs.envs] == [1, 0, 1]

    observations, infos = envs.reset(options={"task": "d", "initial_state": "state d"})  # one episode for all
    assert observations == ("state d",) * 3 and [env.episode.task for env in envs.envs] == ["d"] * 3
    envs.close()


def test_a_bad_episode_among_several_resets_none_of_them(server):
    """The third episode's misspelt field was found after the first two had reset: the call failed half done."""
    from pipeline.serving.episode import EpisodeError

    envs = vector(server, EPISODES)
    envs.reset(seed=0)
    stepped, *_ = envs.step(["ls", "ls", "ls"])
    bad = [{"task": "a"}, {"task": "b"}, {"task": "c", "sucess_pattern": "x"}]
    with pytest.raises(EpisodeError, match="unknown episode field.*sucess_pattern"):
        envs.reset(options={"episodes": bad})
    assert [env.episode for env in envs.envs] == list(EPISODES)  # none replaced
    assert [len(env.simulator.history) for env in envs.envs] == [1, 1, 1]  # none reset
    envs.close()


def test_a_failed_request_truncates_its_sub_episode_and_no_other(server):
    envs = vector(server, [EPISODES[1], EPISODES[2], EPISODES[1]])  # no step limit: only the failure ends one
    initial, _ = envs.reset(seed=0)
    observations, rewards, terminated, truncated, infos = envs.step(["ls", UNANSWERABLE, "echo hi"])
    assert observations[1] == initial[1]  # nothing was simulated
    assert (list(rewards), list(terminated), list(truncated)) == ([0.0] * 3, [False] * 3, [False, True, False])
    assert list(infos["_error"]) == [False, True, False]
    assert infos["error"][1].startswith("ContextExhausted: ") and infos["reason"][1].startswith("the request failed")
    assert list(infos["_steps"]) == [True, False, True]  # the others stepped, as usual
    assert [len(env.simulator.history) for env in envs.envs] == [1, 0, 1]

    observations, rewards, terminated, truncated, infos = envs.step(["cat notes.txt", "ignored", "echo bye"])
    assert list(infos["_task"]) == [False, True, False] and observations[1] == initial[1]  # autoreset
    assert not truncated.any() and "_error" not in infos

    with pytest.raises(ContextExhausted):  # every request of the step failed
        envs.step([UNANSWERABLE] * 3)
    envs.close()


def test_the_documented_example_runs(server):
    """docs/serving.md's vector-environment example, against this server and model."""
    page = (REPO / "docs/serving.md").read_text(encoding="utf-8")
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "WorldModelVectorEnv(" in block]
    example = example.replace("http://127.0.0.1:8000/v1", server).replace(
        "simulacra-world-model-<fingerprint>", MODEL_NAME
    )
    namespace: dict = {}
    exec(compile(example, "docs/serving.md", "exec"), namespace)
    assert namespace["envs"].closed


def test_the_benchmark_compares_both_ways_on_the_same_episodes(server):
    """bench/fidelity.py's speed comparison, small: its episodes are the demo's real sessions (their system prompts
    pass this tiny model's context, so it runs this module's three), one at a time and together seeing the same
    observations (same seeds and actions; sampled at temperature 1)."""
    spec = importlib.util.spec_from_file_location("fidelity_bench", REPO / "bench" / "fidelity.py")
    fidelity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fidelity)
    sessions = fidelity.demo_episodes(3, 2)
    assert [episode.actions for episode in sessions] == [
        [turn["action"] for turn in json.loads(line)["turns"][:2]]
        for line in (REPO / "data/demo/terminal.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    ]
    assert sessions[0].spec.system.initial_state.startswith("Working directory /home/user/work")
    episodes = [fidelity.Episode(episode, [row[i] for row in ACTIONS[:2]]) for i, episode in enumerate(EPISODES)]
    result = fidelity.compare_speed(server, MODEL_NAME, episodes, max_tokens=8)
    assert (result.episodes, result.steps, len(result.together[0])) == (3, 2, 2)
    assert result.together == result.alone and result.same_steps == 6


def test_the_benchmark_takes_fidelity_budgets_and_nothing_else():
    """bench/fidelity.py's `--set`: a `fidelity.` field overrides its budget; anything else is refused by name,
    before a model is served."""
    spec = importlib.util.spec_from_file_location("fidelity_bench", REPO / "bench" / "fidelity.py")
    fidelity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fidelity)
    assert fidelity._setting("fidelity.episodes_per_policy=5") == ("fidelity.episodes_per_policy", "5")
    assert set(fidelity.FIDELITY_BUDGETS) <= set(f"fidelity.{name}" for name in FidelityConfig.model_fields)
    for wrong in ("evaluate.max_queries=3", "fidelity.episodes_per_policy"):
        with pytest.raises(SystemExit, match="expected fidelity.FIELD=VALUE"):
            fidelity._setting(wrong)
    fidelity._check(fidelity.FIDELITY_BUDGETS)
    # The demo config plays no policy episodes; the bench's budgets play them in every environment.
    budgets = [parse_override(f"{key}={value}") for key, value in fidelity.FIDELITY_BUDGETS.items()]
    assert load_config(REPO / "data/configs/demo.yaml").fidelity.environments == []
    assert load_config(REPO / "data/configs/demo.yaml", budgets).fidelity.environments == list(ENVIRONMENTS)
    with pytest.raises(SystemExit, match="episodes_per_policy"):
        fidelity._check({"fidelity.episodes_per_policy": "0"})
