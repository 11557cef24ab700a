"""Build the demo corpus Simulacra ships: real runs of three small environments, plus flawed records.

    python data/build_demo_corpus.py [--out data/demo]

- terminal.jsonl: a scripted agent issues real bash commands in a fresh temporary home per
  trajectory, seeded with generated files; observations are what bash really printed.
- tool_calls.json: a scripted agent calls the tools of a small in-process bookstore service with
  state; every tool response (errors and pagination included) is what the service returned.
- text_games/*.txt: a scripted agent plays an ALFWorld-like text adventure run by the household
  engine; one game per file, in the log form TextWorld / ALFWorld harnesses write.
- flawed.jsonl: records that must be quarantined or filtered (see FLAWED RECORDS in
  demo_builder/flawed.py).
- terminal_env.md: the versions of the tools whose messages appear in terminal.jsonl.
- README.md: what each file holds, with counts.

The builder itself is the package demo_builder/ next to this script, one module a concern; the
environments it runs are in pipeline/environments/.

Rerunnable and deterministic: string seeds (hashed with SHA-512 by `random`, so independent of
PYTHONHASHSEED), sorted iteration, no clocks or PIDs, and the temporary directory replaced by
/home/user in every observation. Only the standard library and `pipeline` are needed.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Run as a script, `data/` is on sys.path (so `demo_builder` imports), not the repository root
# that holds `pipeline`.
sys.path.insert(0, str(REPO))

from demo_builder.corpus import build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "data" / "demo", help="output folder (default data/demo)")
    counts = build(parser.parse_args().out)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
