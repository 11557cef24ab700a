"""The rule reward: a turn's verifier code judges a prediction, in the sandbox (SPEC "Rule reward").

A turn may carry `metadata.verifier`: Python source defining `verify(prediction: str) -> bool`
(ingestion keeps turn metadata as it is). The reward is 25 when `verify` returns True, 0 when it
returns False or anything else goes wrong (an exception, a non-bool, no `verify`, a limit, a
timeout, a sandbox the kernel refused), always with the reason; None for a turn without a verifier:
the rule does not apply to that sample (how the combination weighs it is the RL stage's, as TRL
allows a reward function to return None). SPEC's 0/1 scaled to [0, 25], the rubric reward's
scale, so the 0.9 / 0.1 weights mix like with like.
"""

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.sandbox import SandboxConfig
from pipeline.rewards.sandbox import SandboxJob, SandboxResult, run_many

PASS_REWARD = 25.0
FAIL_REWARD = 0.0
HARNESS = Path(__file__).with_name("verifier_harness.py").read_text()


@dataclass(frozen=True)
class RuleOutcome:
    """One rule reward: `reward` 25.0 / 0.0, or None where the turn has no verifier; `reason` says
    why in one line; `status` is `pass`, `fail`, `error` (the verifier's code failed, the reason
    says how), or a sandbox status (`timeout`, `signalled`, `refused`, `setup_failed`), or
    `no_verifier`."""

    reward: float | None
    status: str
    reason: str


NO_VERIFIER = RuleOutcome(None, "no_verifier", "turn has no verifier")


def verifier_of(turn_metadata: dict | None) -> str | None:
    """The verifier code a turn carries, or None (absent, empty or not a string)."""
    code = (turn_metadata or {}).get("verifier")
    return code if isinstance(code, str) and code.strip() else None


def rule_rewards(
    verifiers: Sequence[str | None], predictions: Sequence[str], config: SandboxConfig
) -> list[RuleOutcome]:
    """Rule rewards for a batch (one RL step's completions), `config.concurrency` sandboxes at a
    time; results in order. A None verifier costs nothing."""
    if len(verifiers) != len(predictions):
        raise ValueError(f"{len(verifiers)} verifiers for {len(predictions)} predictions")
    jobs = [
        (
            index,
            SandboxJob(HARNESS, {"verifier.py": code, "prediction.txt": prediction}, secrets.token_hex(16).encode()),
        )
        for index, (code, prediction) in enumerate(zip(verifiers, predictions))
        if code is not None
    ]
    outcomes = [NO_VERIFIER] * len(verifiers)
    for (index, job), result in zip(jobs, run_many([job for _, job in jobs], config)):
        outcomes[index] = outcome(result, job.stdin)
    return outcomes


def rule_reward(verifier: str | None, prediction: str, config: SandboxConfig) -> RuleOutcome:
    return rule_rewards([verifier], [prediction], config)[0]


def outcome(result: SandboxResult, nonce: bytes) -> RuleOutcome:
    """The reward a sandbox run earns: a pass needs the harness's one verdict, framed by this
    run's nonce, and a clean exit; everything else is 0 with the reason."""
    if result.status != "exited":
        return RuleOutcome(FAIL_REWARD, result.status, result.reason)
    if not result.report:
        return RuleOutcome(FAIL_REWARD, "error", f"verifier gave no verdict ({result.reason})")
    lines = result.report.splitlines()
    if len(lines) > 1:
        return RuleOutcome(FAIL_REWARD, "error", f"{len(lines)} verdict lines where one is expected")
    frame, _, verdict = lines[0].partition(b" ")
    if frame != nonce or not result.report.endswith(b"\n"):
        return RuleOutcome(FAIL_REWARD, "error", f"verdict without this run's frame: {lines[0][:80]!r}")
    kind, _, reason = verdict.decode("utf-8", "replace").partition(" ")
    if kind == "pass" and result.exit_code == 0:
        return RuleOutcome(PASS_REWARD, "pass", reason)
    if kind in ("fail", "error"):
        return RuleOutcome(FAIL_REWARD, kind, reason)
    return RuleOutcome(FAIL_REWARD, "error", f"malformed verdict {verdict[:80]!r} ({result.reason})")
