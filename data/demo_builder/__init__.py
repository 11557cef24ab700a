"""The demo corpus builder behind `data/build_demo_corpus.py`: per environment, the scripted agent
that runs it, then the flawed records and the writer. The environments themselves (the engines and
their deals) live in the installed package, pipeline/environments/, where `simulacra fidelity` runs
them too (issue 31).

- terminal: runs each task family's commands (pipeline/environments/shell_tasks.py) in real bash in
  a throwaway home (pipeline/environments/terminal.py): terminal.jsonl, terminal_env.md;
- tool_calls: scripted support conversations calling the bookstore service
  (pipeline/environments/bookstore.py): tool_calls.json;
- text_games: the game logs (text_games/) the scripted player leaves of the household engine's games
  (pipeline/environments/household.py; the player and the choice of games, which the deal shares, in
  household_player.py);
- flawed: records made to be quarantined or filtered (flawed.jsonl);
- verifiers: the rule reward's code attached to turns whose answer the builder knows;
- corpus: writes every file, and the README with the counts.
"""

import json

SOURCE = "simulacra-demo"


def jsonl_line(record: object) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"
