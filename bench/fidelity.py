"""Simulated episodes of a served world model (issue 31): episodes per second run one at a time against all
together, in one run, on one server, with the same seeds and actions; then the demo's fidelity tables.

    python bench/fidelity.py [--model-folder DIR|tiny] [--episodes 4] [--steps 3] [--max-tokens 64]
                             [--temperature 1.0] [--no-fidelity] [--set fidelity.FIELD=VALUE ...]

`simulacra serve` runs `--model-folder` on 127.0.0.1 in its own process: by default the demo's exported model
(`make demo` exports it to <workspace>/runs/export/<fingerprint>/model, the workspace of data/configs/demo.yaml);
`tiny` exports the tiny offline model here instead. The episodes are the demo corpus's terminal sessions
(data/demo/terminal.jsonl) with `--steps` turns or more, in file order: each session's system prompt and its first
`--steps` real actions, episode i seeded i, no end but the last action. They run (a) one after the other through
`WorldModelEnv`, each request alone in the server's batch, then (b) all together through `WorldModelVectorEnv`,
each step's requests in flight at once and decoded in one batch. Prints each way's wall time and episodes per
second, their ratio (the ideal is the number of episodes; what separates a run from it is the decoder's per-step
cost growing with the batch), and for how many episodes both ways saw the same observation at every step. The
seeds make sampling reproducible, but a batch pads its rows and so changes float rounding, which may move a sampled
token (or a greedy one at a near tie: pipeline/llm/batching.py), and since an episode's history is its own
answers, a moved token changes every later step of that episode.

Then, on the demo's export (not with `--model-folder`), the fidelity itself: `simulacra fidelity --checkpoint
<the export>` on the demo's workspace, as a user runs it (closed-loop rollouts of eval-pool trajectories, and the
policy ladder in the three real environments, in the served export and in the retrieval baseline, which the stage
always adds), at the budgets below, sized so the whole bench fits 30 minutes on 2 cores, and prints its tables
(`fidelity.txt`, `agreement.txt`). `--all-models` measures what the stage measures by default instead, the base
model and the checkpoint export ships beside the baseline: about twice the time. A rerun reuses every stored step
and episode (the stage is resumable), so a second run is the tables alone. `--no-fidelity` skips it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serving import export_tiny, free_port, start
from pipeline.config.fidelity import ENVIRONMENTS
from pipeline.serving.episode import EpisodeSpec

DEMO_CONFIG = REPO / "data/configs/demo.yaml"
DEMO_SESSIONS = REPO / "data/demo/terminal.jsonl"
DOMAIN = "terminal"  # the sessions' domain

# The fidelity part's budgets (`fidelity.*`, on data/configs/demo.yaml's workspace), sized so the bench fits 30
# minutes on 2 cores. The time goes to the simulated episodes: 5 policies x `episodes_per_policy` tasks x 3
# environments, up to 15 steps in the terminal and 20 in the household (the noisy and random rungs run to the
# limit), and every step a fresh request whose whole history the server prefills again (about 260 prompt tokens/s
# on 2 cores): 32 episodes together at 600 tokens a prompt is over a minute a step. 2 tasks a policy hold every
# terminal and household episode in one wave of the server's batch (32); the bookstore's prompts (1,200 tokens of
# tool schemas) pass the demo model's 1,024-token context and end at once. 64 tokens hold the terminal's and the
# household's observations (the demo's p95 over all domains is 81: tool JSON). Measured: at 3 tasks a policy the
# base model's episodes alone ran past 20 minutes (docs/performance.md). The three environments are named here: the demo
# config plays none (its fidelity stage is rollouts only, for its 15 minutes), and without them the policy ladder
# would silently not run.
FIDELITY_BUDGETS = {
    "fidelity.environments": "[" + ", ".join(ENVIRONMENTS) + "]",
    "fidelity.max_trajectories": 12,
    "fidelity.max_steps": 5,
    "fidelity.episodes_per_policy": 2,
    "fidelity.episodes_together": 32,
    "fidelity.max_tokens": 64,
}


@dataclass(frozen=True)
class Episode:
    spec: EpisodeSpec
    actions: list[str]


@dataclass(frozen=True)
class SpeedComparison:
    episodes: int
    steps: int
    one_at_a_time_s: float
    together_s: float
    alone: list[list[str]]  # each episode's observations, run one at a time
    together: list[list[str]]  # the same, stepped together

    @property
    def ratio(self) -> float:
        return self.one_at_a_time_s / self.together_s

    @property
    def same_episodes(self) -> int:
        return sum(a == b for a, b in zip(self.alone, self.together))

    @property
    def same_steps(self) -> int:
        return sum(x == y for a, b in zip(self.alone, self.together) for x, y in zip(a, b))


def demo_runs(stage: str) -> Path:
    """`<workspace>/runs/<stage>` of the demo's configuration, its relative workspace taken from the repository."""
    from pipeline.config import load_config

    workspace = load_config(DEMO_CONFIG).workspace.path.expanduser()
    return (workspace if workspace.is_absolute() else REPO / workspace) / "runs" / stage


def demo_export() -> Path | None:
    """The newest complete export of the demo's workspace (`simulacra.json` is written last), or None."""
    from pipeline.config import load_config

    config = load_config(DEMO_CONFIG)
    if config.export.output_dir:
        folders = [Path(config.export.output_dir).expanduser()]
    else:
        folders = sorted(demo_runs("export").glob("*/model"), key=lambda folder: folder.stat().st_mtime)
    complete = [folder for folder in folders if (folder / "simulacra.json").is_file()]
    return complete[-1] if complete else None


def model_folder(given: str | None, scratch: Path) -> Path:
    if given == "tiny":
        return export_tiny(scratch)
    folder = Path(given) if given else demo_export()
    if folder is None:
        raise SystemExit(
            "fidelity: the demo has no exported model yet: run `make demo`, or pass --model-folder DIR (an exported "
            "folder) or --model-folder tiny"
        )
    if not (folder / "simulacra.json").is_file():
        raise SystemExit(
            f"fidelity: {folder} is not an exported world model (no simulacra.json): run `simulacra export`"
        )
    return folder


def demo_episodes(count: int, steps: int) -> list[Episode]:
    """The first `count` demo terminal sessions with `steps` turns or more: their system prompt, `steps` actions."""
    episodes = []
    for line in DEMO_SESSIONS.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if len(record["turns"]) < steps:
            continue
        system = record["system"]
        spec = EpisodeSpec.from_mapping({**system, "task": system["task_description"]})
        actions = [str(turn["action"]) for turn in record["turns"][:steps]]
        episodes.append(Episode(spec, actions))
        if len(episodes) == count:
            return episodes
    raise SystemExit(f"fidelity: {DEMO_SESSIONS} has {len(episodes)} sessions of {steps} turns or more, not {count}")


def one_at_a_time(base_url: str, model: str, episodes: list[Episode], **options) -> tuple[list[list[str]], float]:
    """Each episode through one `WorldModelEnv`, one after the other: (observations per episode, seconds)."""
    from pipeline.serving.gym_env import WorldModelEnv

    env = WorldModelEnv(base_url, model, DOMAIN, episodes[0].spec, **options)
    observed = []
    began = time.perf_counter()
    for seed, episode in enumerate(episodes):
        env.episode = episode.spec
        env.reset(seed=seed)
        observed.append([env.step(action)[0] for action in episode.actions])
    return observed, time.perf_counter() - began


def all_together(base_url: str, model: str, episodes: list[Episode], **options) -> tuple[list[list[str]], float]:
    """Every episode a sub-environment of one `WorldModelVectorEnv`, stepped together: (observations, seconds)."""
    from pipeline.serving.vector_env import WorldModelVectorEnv

    envs = WorldModelVectorEnv(base_url, model, DOMAIN, [episode.spec for episode in episodes], **options)
    steps = len(episodes[0].actions)
    observed: list[list[str]] = [[] for _ in episodes]
    began = time.perf_counter()
    envs.reset(seed=list(range(len(episodes))))
    for t in range(steps):
        observations, *_ = envs.step([episode.actions[t] for episode in episodes])
        for i, observation in enumerate(observations):
            observed[i].append(observation)
    seconds = time.perf_counter() - began
    envs.close()
    return observed, seconds


def compare_speed(base_url: str, model: str, episodes: list[Episode], **options) -> SpeedComparison:
    """(a) one episode at a time, then (b) all stepped together, on the same seeds and actions, after a warm-up
    request (first-request costs are not throughput)."""
    one_at_a_time(base_url, model, [Episode(episodes[0].spec, episodes[0].actions[:1])], **options)
    alone, alone_s = one_at_a_time(base_url, model, episodes, **options)
    together, together_s = all_together(base_url, model, episodes, **options)
    return SpeedComparison(len(episodes), len(episodes[0].actions), alone_s, together_s, alone, together)


def print_speed(result: SpeedComparison, model: str, max_tokens: int, temperature: float) -> None:
    total = result.episodes * result.steps
    print(
        f"{result.episodes} episodes of {result.steps} steps (demo terminal sessions, their real actions), "
        f"max_tokens {max_tokens}, temperature {temperature}, model {model}"
    )
    print(
        f"one episode at a time (WorldModelEnv):   {result.one_at_a_time_s:7.1f} s  "
        f"{result.episodes / result.one_at_a_time_s:6.3f} episodes/s"
    )
    print(
        f"all together (WorldModelVectorEnv):      {result.together_s:7.1f} s  "
        f"{result.episodes / result.together_s:6.3f} episodes/s"
    )
    print(
        f"ratio: {result.ratio:.2f}x faster; same observations in {result.same_episodes} of {result.episodes} "
        f"episodes ({result.same_steps} of {total} steps); load average {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-folder", help="an exported folder, or `tiny` (default: the demo's export, which `make demo` writes)"
    )
    parser.add_argument("--episodes", type=int, default=4, help="episodes of the speed part (each run both ways)")
    parser.add_argument("--steps", type=int, default=3, help="actions per episode (demo sessions have 4 to 10)")
    parser.add_argument("--max-tokens", type=int, default=64, help="token budget of each simulated observation")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (WorldModelEnv's default)")
    parser.add_argument("--no-fidelity", action="store_true", help="episodes per second only, no `simulacra fidelity`")
    parser.add_argument(
        "--all-models",
        action="store_true",
        help="fidelity of the base model and the shipped checkpoint (and the retrieval baseline), not of the export",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="fidelity.FIELD=VALUE",
        help="a budget of the fidelity part other than FIDELITY_BUDGETS' (repeatable)",
    )
    args = parser.parse_args()
    budgets = dict(FIDELITY_BUDGETS, **dict(_setting(text) for text in args.set))
    _check(budgets)  # a wrong budget is refused before any model is served
    episodes = demo_episodes(args.episodes, args.steps)
    with tempfile.TemporaryDirectory() as scratch:
        folder = model_folder(args.model_folder, Path(scratch))
        port = free_port()
        process, name = start("simulacra", folder, port)
        try:
            result = compare_speed(
                f"http://127.0.0.1:{port}/v1", name, episodes, max_tokens=args.max_tokens, temperature=args.temperature
            )
        finally:
            process.terminate()
            process.wait(timeout=30)
    print_speed(
        result,
        "the tiny offline model" if args.model_folder == "tiny" else str(folder),
        args.max_tokens,
        args.temperature,
    )
    if args.model_folder is None and not args.no_fidelity:
        measure_fidelity(budgets, None if args.all_models else folder)


def _setting(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key.startswith("fidelity."):
        raise SystemExit(f"fidelity: --set {text!r}: expected fidelity.FIELD=VALUE")
    return key, value


def _check(budgets: dict) -> None:
    """The demo's configuration with `budgets` validates, or the bench stops with the configuration's one line."""
    from pipeline.config import ConfigError, load_config, parse_override

    try:
        load_config(DEMO_CONFIG, [parse_override(f"{key}={value}") for key, value in budgets.items()])
    except ConfigError as error:
        raise SystemExit(f"fidelity: {error}") from None


def measure_fidelity(budgets: dict, export: Path | None) -> None:
    """`simulacra fidelity` on the demo's workspace at `budgets` (of `export` alone, or of the stage's own models
    when None), then its tables."""
    command = [sys.executable, "-m", "pipeline.cli", "--config", str(DEMO_CONFIG)]
    for key, value in budgets.items():
        command += ["--set", f"{key}={value}"]
    command.append("fidelity")
    if export is not None:
        command += ["--checkpoint", str(export)]
    print("\n" + " ".join(command[2:]), flush=True)
    began = time.perf_counter()
    finished = subprocess.run(command, cwd=REPO)
    seconds = time.perf_counter() - began
    if finished.returncode != 0:  # the command said why (a budget's value, a missing input) on its own output
        raise SystemExit(f"fidelity: `simulacra fidelity` exited with status {finished.returncode}")
    runs = demo_runs("fidelity")
    reports = sorted(runs.glob("*/report.json"), key=lambda path: path.stat().st_mtime)
    if not reports:
        raise SystemExit(f"fidelity: no report.json under {runs} after the run")
    folder = reports[-1].parent
    for table in ("fidelity.txt", "agreement.txt"):
        if (folder / table).is_file():
            print(f"\n{folder / table}\n" + (folder / table).read_text())
    print(f"fidelity: {seconds:.0f} s; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
