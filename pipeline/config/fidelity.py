"""Configuration of `simulacra fidelity` (issue 31): how far each simulator can be trusted, closed loop and by
the policies it ranks."""

from typing import Literal

from pydantic import Field

from pipeline.config.base import Section

# A step has diverged when its score is below 50 of 100: where evaluation's semantic match draws the line
# (`evaluate.semantic_match_threshold` 0.5: a match is a similarity above 0.5, i.e. a score above 50 on the
# similarity judge) and where SFT's `min_score` of 3 on the judge's 1-5 scale does (a score of 50); on an LLM
# judge, 50 is a mean criterion of 3, "partly right". Below it the simulator is telling another story.
# Here rather than in pipeline/fidelity/curves.py, which uses it, so the configuration imports nothing heavy.
DIVERGENCE_THRESHOLD = 50.0

# The demo's three environments by domain (pipeline/environments/demo_environments.py runs their real engines).
Environment = Literal["terminal", "mcp", "text-game"]
ENVIRONMENTS: tuple[Environment, ...] = ("terminal", "mcp", "text-game")


class FidelityConfig(Section):
    enabled: bool = Field(
        default=False,
        description="Run the stage in the DAG (`simulacra run`, the pipeline flow), after evaluate. Off by default: "
        "it serves every model and plays hundreds of episodes, minutes on a CPU; `simulacra fidelity` and "
        "`--stages fidelity` run it whatever this says.",
    )
    # --- closed-loop rollouts -------------------------------------------------------------------
    max_trajectories: int | None = Field(
        default=20,
        ge=1,
        description="Held-out trajectories rolled out per model (a seeded choice of the eval pool's or of the "
        "`--data` files', a larger budget a superset); None: all. 20 gives a curve whose 95% interval is about "
        "+-10 points at the first steps; every trajectory costs two requests a step.",
    )
    max_steps: int | None = Field(
        default=10,
        ge=1,
        description="Environment turns rolled out per trajectory; None: all of them. The demo's trajectories run 4 "
        "to 10 turns, so 10 follows them whole; errors compound within a few steps or not at all.",
    )
    seed: int = Field(default=0, description="Seed of the trajectory choice under `max_trajectories`.")
    divergence_threshold: float = Field(
        default=DIVERGENCE_THRESHOLD,
        ge=0,
        le=100,
        description="A step has diverged when its score (0-100) is below this. 50 is where evaluation's semantic "
        "match and SFT's min_score of 3 draw the line.",
    )
    # --- policy agreement -----------------------------------------------------------------------
    environments: list[Environment] = Field(
        default_factory=lambda: list(ENVIRONMENTS),
        description="The real environments the policies play, by domain: terminal (bash in a scratch home), mcp "
        "(the bookstore's tools), text-game (the household engine), the engines that made the demo corpus. "
        "Empty: no policy agreement, closed-loop rollouts only.",
    )
    episodes_per_policy: int = Field(
        default=10,
        ge=1,
        description="Episodes each policy of the ladder plays in each environment, seeds 0..N-1 (the corpus's "
        "first N tasks), in the real environment and in each simulator. 10 separates the solver (all succeed) from "
        "the random policy (none) with non-overlapping 95% intervals; the noisy rungs between need more.",
    )
    episodes_together: int = Field(
        default=16,
        ge=1,
        description="Simulated episodes stepped together against one served model (a vector environment: their "
        "requests decoded in one batch). Half of `simulacra serve`'s default batch of 32, so the rollouts' requests "
        "share it too.",
    )
    # --- how a simulator is asked ----------------------------------------------------------------
    max_tokens: int = Field(
        default=512,
        ge=1,
        description="Token budget of each simulated observation, in rollouts and in episodes: the environment "
        "classes' default, above the demo's p95 observation (81 tokens) with room for a thinking block.",
    )
    temperature: float = Field(
        default=1.0,
        ge=0,
        description="Sampling temperature of the simulated episodes: the gymnasium environment's default, what an "
        "agent trained in the simulator meets (each step seeded from its episode). The rollouts are asked as "
        "evaluation asks (`evaluate.predictor`'s sampling, greedy by default), so their scores match its own.",
    )
