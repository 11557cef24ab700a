"""The demo corpus builder behind `data/build_demo_corpus.py`: per environment, one module for the
environment and one for the scripted agent that runs it, then the flawed records and the writer.

- shell_tasks: terminal task families, each a seeded workspace and the commands an agent types;
- terminal: runs those commands in real bash in a throwaway home (terminal.jsonl, terminal_env.md);
- bookstore: the in-process bookstore service with state that the tool calls go to;
- tool_calls: scripted support conversations calling that service (tool_calls.json);
- household: the ALFWorld-like text-game engine and the games it deals;
- text_games: the scripted player and the game logs it leaves (text_games/);
- flawed: records made to be quarantined or filtered (flawed.jsonl);
- corpus: writes every file, and the README with the counts.
"""

import json

SOURCE = "simulacra-demo"


def jsonl_line(record: object) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"
