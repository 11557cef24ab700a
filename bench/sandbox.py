"""Sandboxed verifications per second vs plain subprocesses running the same verifiers.

    .venv/bin/python bench/sandbox.py [--verifications 200] [--concurrency N]

The demo corpus's verifiers (terminal counts and tool-reply key checks) on their own reference
observations, cycled to `--verifications`. Both sides run the same number at once (default: one
per CPU, the batch API's default) from a thread pool:
- sandboxed: `pipeline.rewards.rule.rule_rewards` (a user namespace and five others, a root of its
  own, own uid, seccomp, limits: two Python processes per verification, the launcher and the
  verifier, and the launcher's forks: PID 1 and, as root, the helper that writes the uid maps);
- plain: one `python -I -S -B -c` subprocess per verification, the verifier's code and a call of
  `verify` on stdin's prediction: no isolation at all, the floor of running it in its own process.
Both must agree on every verdict. Only figures of this run are printed; the ratios are the figures:
wall time, and CPU time of the child processes (user + system, from getrusage: every launcher,
namespace init and verifier is waited for by its parent), which a loaded machine disturbs less.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config.sandbox import SandboxConfig
from pipeline.rewards.rule import rule_rewards

DEMO = REPO / "data" / "demo"
CALL = "\nimport sys\nprint(verify(sys.stdin.read()) is True)\n"


def demo_verifications() -> list[tuple[str, str]]:
    """(verifier, reference observation) of every demo turn that has one, terminal then tools."""
    pairs = []
    for line in (DEMO / "terminal.jsonl").read_text().splitlines():
        pairs += [
            (t["metadata"]["verifier"], t["observation"])
            for t in json.loads(line)["turns"]
            if "verifier" in t.get("metadata", {})
        ]
    for conversation in json.loads((DEMO / "tool_calls.json").read_text()):
        pairs += [(m["verifier"], m["content"]) for m in conversation["messages"] if "verifier" in m]
    return pairs


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def plain(pair: tuple[str, str]) -> bool:
    code, prediction = pair
    completed = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", code + CALL],
        input=prediction,
        capture_output=True,
        text=True,
        check=True,
    )
    return completed.stdout.strip() == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifications", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    available = demo_verifications()
    # Alternate terminal and tool verifiers, so any prefix of the run holds both kinds.
    terminal = [p for p in available if "import json" not in p[0]]
    tools = [p for p in available if "import json" in p[0]]
    mixed = [pair for both in zip(terminal * (len(tools) // len(terminal) + 1), tools) for pair in both]
    pairs = (mixed * (args.verifications // len(mixed) + 1))[: args.verifications]
    config = SandboxConfig(concurrency=args.concurrency)

    cpu, started = children_cpu_s(), time.perf_counter()
    sandboxed = rule_rewards([code for code, _ in pairs], [prediction for _, prediction in pairs], config)
    sandboxed_s, sandboxed_cpu = time.perf_counter() - started, children_cpu_s() - cpu

    cpu, started = children_cpu_s(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        baseline = list(pool.map(plain, pairs))
    plain_s, plain_cpu = time.perf_counter() - started, children_cpu_s() - cpu

    passes = [outcome.status == "pass" for outcome in sandboxed]
    if passes != baseline:
        disagreements = [(o.status, o.reason) for o, b in zip(sandboxed, baseline) if (o.status == "pass") != b]
        raise SystemExit(f"sandboxed and plain verdicts disagree: {disagreements[:3]}")
    n = len(pairs)
    print(
        f"{n} verifications of the demo's verifiers, {args.concurrency} at a time, on {os.cpu_count()} CPUs; "
        f"{sum(passes)} pass in both"
    )
    print(
        f"sandboxed: {sandboxed_s:.2f} s, {n / sandboxed_s:.1f} verifications/s, "
        f"{1000 * sandboxed_cpu / n:.1f} CPU-ms each"
    )
    print(
        f"plain python -I -S -c: {plain_s:.2f} s, {n / plain_s:.1f} verifications/s, {1000 * plain_cpu / n:.1f} CPU-ms each"
    )
    print(f"ratio sandboxed / plain: {sandboxed_s / plain_s:.2f}x wall time, {sandboxed_cpu / plain_cpu:.2f}x CPU time")


if __name__ == "__main__":
    main()
