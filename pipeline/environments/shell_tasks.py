"""Terminal task families: each draws, from a seeded `random.Random`, the files of a workspace and
the commands a scripted agent types to do the task there, mistakes and detours included."""

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

COMPONENTS = ["auth", "billing", "cache", "db", "mailer", "scheduler", "search", "storage"]
INFO_MESSAGES = [
    "request served in 42ms",
    "user session refreshed",
    "cache warmed with 512 keys",
    "job queued",
    "health check passed",
    "config reloaded",
    "invoice batch exported",
    "index snapshot written",
]
WARN_MESSAGES = [
    "slow query took 1.8s",
    "retrying upload (attempt 2)",
    "disk usage at 81%",
    "token expires soon",
    "queue depth above 1000",
]
ERROR_MESSAGES = [
    "connection pool exhausted",
    "invalid signature on webhook",
    "disk quota exceeded",
    "deadlock detected in transaction",
    "template invoice.html missing",
    "payment declined: card expired",
    "index segment checksum mismatch",
    "smtp relay rejected recipient",
]
FIRST_NAMES = ["ada", "bruno", "chen", "dana", "emeka", "farah", "goran", "hana", "ivan", "julia", "kofi", "lena"]
DOMAINS = ["example.com", "example.org", "mail.test"]
DB_HOSTS = ["db.internal", "10.0.4.12", "postgres.local"]
WORDS = (
    "river stone light paper garden market window signal winter copper harbor orchard lantern "
    "meadow thread compass engine ladder valley crystal"
).split()


@dataclass
class ShellTask:
    family: str
    task: str
    files: dict[str, str]
    commands: list[str]
    # Text the last observation shows when the task is done: the outcome reward checks the real
    # output for it, so a run the agent cut short scores 0.
    done_when: str
    # The same evidence as a line the last observation must hold whole (a regular expression, matched
    # against each line): the episode's success check (environments/terminal_env.py). Stricter than
    # `done_when`, whose "0" or " the" a listing or a sentence may hold by chance, and equal to it on
    # every run of the corpus (tests/test_real_environments.py).
    done_line: str
    # Counting commands whose output the task computed from the files it seeded: command -> the
    # output's whitespace-separated fields. Those turns get a verifier (verifiers.count_verifier).
    counts: dict[str, list[str]] = field(default_factory=dict)


def log_file(rng: random.Random, lines: int, day: int, error_rate: float) -> str:
    seconds = rng.randint(0, 3600)
    out = []
    for _ in range(lines):
        seconds += rng.randint(1, 400)
        roll = rng.random()
        if roll < error_rate:
            level, message = "ERROR", rng.choice(ERROR_MESSAGES)
        elif roll < error_rate + 0.15:
            level, message = "WARN", rng.choice(WARN_MESSAGES)
        else:
            level, message = "INFO", rng.choice(INFO_MESSAGES)
        stamp = f"2024-03-{day:02d}T{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}Z"
        out.append(f"{stamp} {level:<5} [{rng.choice(COMPONENTS)}] {message}\n")
    return "".join(out)


def maybe(rng: random.Random, probability: float, *commands: str) -> list[str]:
    return list(commands) if rng.random() < probability else []


def task_largest_log(rng: random.Random) -> ShellTask:
    services = ["api", "auth", "billing", "gateway", "mailer", "scheduler", "worker"]
    names = sorted(rng.sample(services, rng.randint(3, 5)))
    files = {f"logs/{name}.log": log_file(rng, rng.randint(4, 30), rng.randint(1, 28), 0.15) for name in names}
    files["notes.txt"] = "Rotate logs weekly; keep the largest for the incident review.\n"
    sizes = {path: len(text.encode()) for path, text in files.items() if path.startswith("logs/")}
    largest = max(sorted(sizes), key=lambda path: sizes[path])
    commands = ["ls -1", *maybe(rng, 0.3, "ls -1 log"), "ls -1 logs", "wc -c logs/*.log | sort -n"]
    commands += maybe(rng, 0.5, f"du -b {largest}")
    commands += [f"tail -n 3 {largest}", f"echo 'largest log: {largest} ({sizes[largest]} bytes)'"]
    return ShellTask(
        "largest_log",
        "Find the largest log file under logs/ and show its last three lines.",
        files,
        commands,
        f"largest log: {largest}",
        done_line=re.escape(f"largest log: {largest} ({sizes[largest]} bytes)"),
    )


def task_count_errors(rng: random.Random) -> ShellTask:
    names = sorted(rng.sample(["api", "auth", "billing", "worker", "search"], rng.randint(2, 4)))
    files = {f"logs/{name}.log": log_file(rng, rng.randint(10, 35), 14, rng.uniform(0.1, 0.35)) for name in names}
    commands = [
        "ls -1 logs",
        f"head -n 3 logs/{names[0]}.log",
        *maybe(rng, 0.25, "grpe -c ERROR logs/*.log"),
        "grep -c ERROR logs/*.log",
        *maybe(rng, 0.4, "grep -c WARN logs/*.log"),
    ]
    commands += maybe(rng, 0.5, "grep -h ERROR logs/*.log | head -n 4")
    commands += maybe(rng, 0.3, "grep -c FATAL logs/*.log")
    commands += [
        "grep -h ERROR logs/*.log | sed -n 's/.*ERROR \\[\\([a-z]*\\)\\].*/\\1/p' | sort | uniq -c | sort -rn",
        "grep -h ERROR logs/*.log | wc -l",
    ]
    total = sum(text.count(" ERROR ") for text in files.values())
    return ShellTask(
        "count_errors",
        "Count the ERROR lines in every log under logs/ and find which component logs the most errors.",
        files,
        commands,
        str(total),
        done_line=str(total),
        counts={"grep -h ERROR logs/*.log | wc -l": [str(total)]},
    )


STATS_MODULE = '''"""Summary statistics for the sensor report."""


def mean(values):
    return sum(values) / len(values)


def summarize(rows):
    values = [float(row["{column}"]) for row in rows]
    return {{"count": len(values), "mean": round(mean(values), 2), "max": max(values)}}
'''
MAIN_MODULE = """import csv
import sys

from stats import summarize


def main(path):
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    summary = summarize(rows)
    for key in sorted(summary):
        print(f"{key}: {summary[key]}")


if __name__ == "__main__":
    main(sys.argv[1])
"""
CHECK_SCRIPT = '''"""Checks for app/stats.py; run from the project root."""
import sys

sys.path.insert(0, "app")
from stats import mean, summarize

rows = [{{"{column}": "2.0"}}, {{"{column}": "4.0"}}]
checks = [
    mean([1.0, 2.0, 3.0]) == 2.0,
    summarize(rows)["count"] == 2,
    summarize(rows)["mean"] == 3.0,
    summarize(rows)["max"] == 4.0,
]
failed = checks.count(False)
print(f"{{len(checks) - failed}} passed, {{failed}} failed")
sys.exit(1 if failed else 0)
'''
# (bug, file the bug is in, broken text, fixed text, commands that find it, the fixing command).
# Each bug is a real defect of the generated project; the agent reads the traceback, looks, fixes.
SCRIPT_BUGS = [
    (
        "name",
        "app/stats.py",
        "len(values)",
        "len(valuse)",
        ["grep -n valuse app/stats.py"],
        "sed -i 's/valuse/values/' app/stats.py",
    ),
    (
        "key",
        "app/stats.py",
        'row["{column}"]',
        'row["{short}"]',
        ["head -n 3 data/readings.csv", "grep -n 'row\\[' app/stats.py"],
        'sed -i \'s/row\\["{short}"\\]/row["{column}"]/\' app/stats.py',
    ),
    (
        "import",
        "app/main.py",
        "from stats import",
        "from statistics_report import",
        ["ls -1 app", "sed -n '1,5p' app/main.py"],
        "sed -i 's/statistics_report/stats/' app/main.py",
    ),
    ("data", None, None, None, ["grep -n 'n/a' data/readings.csv"], "sed -i '/n\\/a/d' data/readings.csv"),
]


def task_fix_script(rng: random.Random) -> ShellTask:
    column, short = rng.choice([("temperature", "temp"), ("humidity", "humid"), ("pressure", "press")])
    bug, path, good, bad, inspect, fix = rng.choice(SCRIPT_BUGS)
    rows = [f"{rng.randint(1, 28):02d}/03,{rng.uniform(5, 35):.1f}" for _ in range(rng.randint(4, 9))]
    if bug == "data":
        rows.insert(rng.randint(1, len(rows) - 1), f"{rng.randint(1, 28):02d}/03,n/a")
    files = {
        "README.md": "# sensor-report\nRun `python3 app/main.py data/readings.csv`; "
        "checks: `python3 tests/check_stats.py`.\n",
        "app/stats.py": STATS_MODULE.format(column=column),
        "app/main.py": MAIN_MODULE,
        "data/readings.csv": f"day,{column}\n" + "\n".join(rows) + "\n",
        "tests/check_stats.py": CHECK_SCRIPT.format(column=column),
    }
    if path is not None:
        assert good is not None and bad is not None  # a bug in a file has both texts; only "data" has neither
        files[path] = files[path].replace(good.format(column=column), bad.format(short=short), 1)
    run = "python3 app/main.py data/readings.csv"
    commands = [*maybe(rng, 0.5, "ls -R"), *maybe(rng, 0.3, "cat README.md"), run]
    commands += [c.format(short=short) for c in inspect]
    commands += maybe(rng, 0.4, "cat -n app/stats.py")
    commands += [fix.format(column=column, short=short), run, "python3 tests/check_stats.py"]
    return ShellTask(
        "fix_script",
        "`python3 app/main.py data/readings.csv` crashes. Find the cause, fix it, "
        "and make sure the checks in tests/ pass.",
        files,
        commands,
        "4 passed, 0 failed",
        done_line="4 passed, 0 failed",
    )


def config_files(rng: random.Random, port: int) -> dict[str, str]:
    host = rng.choice(DB_HOSTS)
    return {
        "config/app.ini": f"[server]\nhost = 0.0.0.0\nport = {port}\nworkers = {rng.randint(2, 8)}\n\n"
        f"[logging]\nlevel = {rng.choice(['info', 'warning', 'debug'])}\nfile = logs/app.log\n",
        "config/database.yaml": f"database:\n  host: {host}\n  port: 5432\n  name: {rng.choice(WORDS)}_prod\n"
        f"  pool_size: {rng.randint(5, 20)}\n",
        "config/features.json": json.dumps(
            {"beta_search": rng.random() < 0.5, "max_upload_mb": rng.choice([10, 25, 50])}, indent=2
        )
        + "\n",
    }


def task_backup(rng: random.Random) -> ShellTask:
    files = config_files(rng, rng.choice([8000, 8080, 8443]))
    archive = f"backups/config-2024-03-{rng.randint(1, 28):02d}.tar.gz"
    commands = [
        "ls -1 config",
        *maybe(rng, 0.4, "ls -1 backups"),
        "mkdir -p backups",
        f"tar --sort=name -czf {archive} config",
        f"tar -tzf {archive}",
    ]
    commands += maybe(
        rng,
        0.5,
        "mkdir -p restore-check",
        f"tar -xzf {archive} -C restore-check",
        "diff -r config restore-check/config && echo identical",
    )
    commands += ["ls -1 backups"]
    return ShellTask(
        "backup",
        "Create a gzip-compressed backup archive of config/ in a backups/ folder and check what it contains.",
        files,
        commands,
        archive.removeprefix("backups/"),
        done_line=re.escape(archive.removeprefix("backups/")),
    )


def task_csv_report(rng: random.Random) -> ShellTask:
    regions = sorted(rng.sample(["north", "south", "east", "west", "central"], rng.randint(3, 5)))
    products = ["notebook", "pen", "stapler", "folder", "marker"]
    rows = [
        f"2024-02-{rng.randint(1, 29):02d},{rng.choice(regions)},{rng.choice(products)},{rng.randint(1, 40)}"
        for _ in range(rng.randint(8, 25))
    ]
    files = {"sales.csv": "date,region,product,units\n" + "\n".join(rows) + "\n"}
    totals: dict[str, int] = {}
    for row in rows:
        _, region, _, units = row.split(",")
        totals[region] = totals.get(region, 0) + int(units)
    script = (
        "import csv, collections; t = collections.Counter(); "
        "[t.update({r['region']: int(r['units'])}) for r in csv.DictReader(open('sales.csv'))]; "
        "print('\\n'.join(f'{k} {v}' for k, v in sorted(t.items())))"
    )
    wrong_column = "import csv; print(sum(int(r['unit']) for r in csv.DictReader(open('sales.csv'))))"
    commands = [
        "ls -1",
        "head -n 5 sales.csv",
        "wc -l sales.csv",
        *maybe(rng, 0.4, "sort -t, -k4 -n sales.csv | tail -n 3"),
        *maybe(rng, 0.5, "cut -d, -f2 sales.csv | tail -n +2 | sort | uniq -c"),
        *maybe(rng, 0.3, f'python3 -c "{wrong_column}"'),
        f'python3 -c "{script}" > report.txt',
        "cat report.txt",
    ]
    best = max(sorted(totals), key=lambda region: totals[region])
    return ShellTask(
        "csv_report",
        "Compute the total units sold per region from sales.csv and save the result in report.txt.",
        files,
        commands,
        f"{best} {totals[best]}",
        done_line=f"{best} {totals[best]}",
        counts={"wc -l sales.csv": [str(len(rows) + 1), "sales.csv"]},
    )


def task_config_edit(rng: random.Random) -> ShellTask:
    old, new = rng.sample([8000, 8080, 8443, 9000, 9090], 2)
    files = config_files(rng, old)
    commands = [
        *maybe(rng, 0.4, "ls -1 config"),
        "cat config/app.ini",
        "grep -n port config/app.ini",
        "cp config/app.ini config/app.ini.bak",
        f"sed -i 's/^port = {old}$/port = {new}/' config/app.ini",
        "diff config/app.ini.bak config/app.ini",
        *maybe(rng, 0.3, "grep -rn 5432 config"),
        "grep -n port config/app.ini",
    ]
    return ShellTask(
        "config_edit",
        f"Change the server port in config/app.ini from {old} to {new}, keep a backup "
        "of the original file, and show the difference.",
        files,
        commands,
        f"port = {new}",
        # `grep -n` prints "3:port = N", `diff` "> port = N".
        done_line=rf"(\d+:|> )?port = {new}",
    )


def task_organize(rng: random.Random) -> ShellTask:
    stems = rng.sample(WORDS, rng.randint(5, 9))
    extensions = ["csv", "txt", "json"]
    files = {}
    for stem in stems:
        extension = rng.choice(extensions)
        files[f"inbox/{stem}.{extension}"] = {
            "csv": "id,value\n1,2\n",
            "txt": f"{stem} notes\n",
            "json": json.dumps({"name": stem}) + "\n",
        }[extension]
    present = sorted({path.rsplit(".", 1)[1] for path in files})
    commands = ["ls -1 inbox", "mkdir -p " + " ".join(f"sorted/{ext}" for ext in present)]
    commands += [f"mv inbox/*.{ext} sorted/{ext}/" for ext in present]
    commands += maybe(rng, 0.4, "mv inbox/*.md sorted/")
    commands += ["ls -R sorted", "ls -A inbox | wc -l"]
    return ShellTask(
        "organize",
        "Sort the files in inbox/ into folders sorted/<extension>/ and leave inbox/ empty.",
        files,
        commands,
        "0",
        done_line="0",
        counts={"ls -A inbox | wc -l": ["0"]},
    )


def task_find_todos(rng: random.Random) -> ShellTask:
    modules = rng.sample(["cli", "models", "storage", "views", "auth", "export"], rng.randint(3, 5))
    notes = ["handle empty input", "add retries", "remove after migration", "log the user id", "validate the schema"]
    files = {}
    todos = 0
    for module in modules:
        lines = [f'"""The {module} module."""', "", ""]
        for index in range(rng.randint(2, 5)):
            lines.append(f"def {module}_{index}(value):")
            if rng.random() < 0.4:
                lines.append(f"    # TODO: {rng.choice(notes)}")
                todos += 1
            lines += ["    return value", "", ""]
        files[f"src/{module}.py"] = "\n".join(lines).rstrip() + "\n"
    commands = [
        "ls -1",
        "find src -name '*.py' | sort",
        *maybe(rng, 0.5, f"sed -n '1,8p' src/{modules[0]}.py"),
        "grep -rn TODO src | sort",
        *maybe(rng, 0.4, "grep -rn FIXME src"),
        *maybe(rng, 0.4, "grep -rn TODO src | cut -d: -f1 | sort | uniq -c"),
        "grep -rn TODO src | wc -l",
    ]
    return ShellTask(
        "find_todos",
        "List every TODO comment under src/ with its file and line, and count them.",
        files,
        commands,
        str(todos),
        done_line=str(todos),
        counts={"grep -rn TODO src | wc -l": [str(todos)]},
    )


def task_large_files(rng: random.Random) -> ShellTask:
    files = {}
    for index in range(rng.randint(5, 9)):
        folder = rng.choice(["assets", "data", "docs"])
        size = rng.choice([rng.randint(100, 1500), rng.randint(2100, 9000)])
        line = f"{rng.choice(WORDS)} {index}\n"
        files[f"{folder}/{rng.choice(WORDS)}-{index}.txt"] = (line * (size // len(line) + 1))[:size]
    big = sorted(path for path, text in files.items() if len(text) > 2048)
    commands = ["ls -1", "find . -type f | sort", "find . -type f -size +2k | sort"]
    commands += maybe(rng, 0.5, f"du -b {max(sorted(files), key=lambda path: len(files[path]))}")
    commands += maybe(rng, 0.3, "find . -type f -size +2k -printf '%s %p\\n' | sort -rn | head -n 3")
    commands += ["find . -type f -size +2k -exec stat -c '%s %n' {} + | sort -rn", "find . -type f -size +2k | wc -l"]
    return ShellTask(
        "large_files",
        "Find the files larger than 2 KiB in this directory tree and list their sizes, largest first.",
        files,
        commands,
        str(len(big)),
        done_line=str(len(big)),
        counts={"find . -type f -size +2k | wc -l": [str(len(big))]},
    )


def task_dedupe(rng: random.Random) -> ShellTask:
    people = [f"{name}@{rng.choice(DOMAINS)}" for name in rng.sample(FIRST_NAMES, rng.randint(5, 10))]
    lines = people + rng.choices(people, k=rng.randint(2, 6))
    rng.shuffle(lines)
    files = {"contacts.txt": "\n".join(lines) + "\n"}
    commands = [
        "ls -1",
        "wc -l contacts.txt",
        *maybe(rng, 0.5, "head -n 5 contacts.txt"),
        "sort contacts.txt | uniq -d",
        *maybe(rng, 0.4, "sort contacts.txt | uniq -c | sort -rn | head -n 3"),
        "sort -u contacts.txt > unique.txt",
        *maybe(rng, 0.5, "diff <(sort contacts.txt) unique.txt"),
        "wc -l unique.txt",
    ]
    return ShellTask(
        "dedupe",
        "contacts.txt has duplicate addresses. Write the unique addresses, sorted, to "
        "unique.txt and report how many there are.",
        files,
        commands,
        f"{len(people)} unique.txt",
        done_line=re.escape(f"{len(people)} unique.txt"),
        counts={
            "wc -l contacts.txt": [str(len(lines)), "contacts.txt"],
            "wc -l unique.txt": [str(len(people)), "unique.txt"],
        },
    )


def task_scaffold(rng: random.Random) -> ShellTask:
    name = rng.choice(WORDS) + "_" + rng.choice(["tool", "cli", "kit"])
    folder = f"tools/{name}"
    # printf's argument as bash receives it: \n for newlines, \" for quotes inside the double quotes.
    main = f'def main():\\n    print(\\"hello from {name}\\")\\n\\n\\nif __name__ == \\"__main__\\":\\n    main()\\n'
    files = {"README.md": "# workspace\nTools live under tools/.\n", "tools/.keep": ""}
    commands = [
        "ls -1 tools",
        f"mkdir -p {folder}",
        f"touch {folder}/__init__.py",
        f"echo '# {name}' > {folder}/README.md",
        f'printf "{main}" > {folder}/main.py',
    ]
    commands += maybe(rng, 0.4, f"python3 {folder}/mian.py")
    commands += [f"python3 {folder}/main.py", f"ls -1 {folder}", *maybe(rng, 0.4, f"cat {folder}/main.py")]
    commands.append(f"python3 {folder}/main.py")
    return ShellTask(
        "scaffold",
        f"Create a Python package skeleton in {folder}/ with an __init__.py, a README and "
        "a main.py that prints a greeting, then run it.",
        files,
        commands,
        f"hello from {name}",
        done_line=f"hello from {name}",
    )


def task_json_fix(rng: random.Random) -> ShellTask:
    host = rng.choice(DB_HOSTS)
    settings = (
        '{\n  "service": "%s",\n  "debug": %s,\n  "database": {\n    "host": "%s",\n    "port": 5432\n  }\n}\n'  # noqa: UP031 - JSON's braces need no doubling with %
        % (rng.choice(WORDS), rng.choice(["true", "false"]), host)
    )
    # Drop the comma after the "service" line: the classic hand-edit mistake.
    broken = settings.replace('",\n  "debug"', '"\n  "debug"', 1)
    files = {"config/settings.json": broken, "config/README": "settings.json is read at start-up.\n"}
    commands = [
        *maybe(rng, 0.4, "ls -1 config", "cat config/README"),
        "python3 -m json.tool config/settings.json",
        "sed -n '1,4p' config/settings.json",
        "sed -i '2s/\"$/\",/' config/settings.json",
        "python3 -m json.tool config/settings.json",
    ]
    commands += maybe(rng, 0.5, "python3 -c \"import json; print(json.load(open('config/settings.json'))['db'])\"")
    commands.append("python3 -c \"import json; print(json.load(open('config/settings.json'))['database']['host'])\"")
    return ShellTask(
        "json_fix",
        "config/settings.json no longer loads. Find the syntax error, fix it, and print the database host.",
        files,
        commands,
        host,
        # The host printed alone, or on the line `python3 -m json.tool` writes once the file parses: it
        # indents by 4, so the nested host sits at 8 spaces (the file itself indents by 2).
        done_line=rf'{re.escape(host)}| {{8}}"host": "{re.escape(host)}",',
    )


REPORT_SCRIPT = """#!/bin/bash
# Counts the records in every CSV file under data/.
for file in data/*.csv; do
  echo "$file: $(($(wc -l < "$file") - 1)) records"
done
"""


def task_run_script(rng: random.Random) -> ShellTask:
    files = {"scripts/report.sh": REPORT_SCRIPT}
    for stem in sorted(rng.sample(WORDS, rng.randint(2, 4))):
        rows = "".join(f"{i},{rng.randint(1, 99)}\n" for i in range(rng.randint(1, 12)))
        files[f"data/{stem}.csv"] = "id,value\n" + rows
    commands = [
        "ls -1 scripts data",
        "./scripts/report.sh",
        "cat scripts/report.sh",
        *maybe(rng, 0.5, "wc -l data/*.csv"),
        "chmod +x scripts/report.sh",
        "./scripts/report.sh",
        *maybe(rng, 0.3, "bash scripts/report.sh | sort -t: -k2 -n"),
    ]
    first = sorted(path for path in files if path.endswith(".csv"))[0]
    records = files[first].count("\n") - 1
    return ShellTask(
        "run_script",
        "Run scripts/report.sh to count the records in each CSV under data/.",
        files,
        commands,
        f"{first}: ",
        done_line=re.escape(f"{first}: {records} records"),
    )


def task_word_count(rng: random.Random) -> ShellTask:
    sentences = [
        "The river carried copper light past the harbor.",
        "A lantern swung above the market stalls.",
        "Winter came early to the orchard and the meadow.",
        "The engine signal faded beyond the valley.",
        "Paper windows glowed in the garden at night.",
        "A compass and a ladder lay by the stone wall.",
        "The harbor market opened before the river fog lifted.",
        "Crystal frost covered the garden gate.",
    ]
    text = " ".join(rng.choice(sentences) for _ in range(rng.randint(6, 14)))
    files = {"notes/field-notes.txt": text + "\n"}
    # The words as the pipeline below splits them: runs of letters, lower-cased.
    the = re.findall("[a-z]+", text.lower()).count("the")
    pipeline = "tr -cs 'A-Za-z' '\\n' < notes/field-notes.txt | tr 'A-Z' 'a-z' | sort | uniq -c | sort -rn"
    commands = [
        "ls -1 notes",
        "wc -w notes/field-notes.txt",
        *maybe(rng, 0.4, "head -c 120 notes/field-notes.txt; echo"),
        f"{pipeline} | head -n 5",
        *maybe(rng, 0.3, "grep -o -i harbor notes/field-notes.txt | wc -l"),
        f"{pipeline} > notes/frequencies.txt",
        *maybe(rng, 0.5, "wc -l notes/frequencies.txt"),
        "head -n 3 notes/frequencies.txt",
    ]
    return ShellTask(
        "word_count",
        "Count the words in notes/field-notes.txt and save the word frequencies, most "
        "frequent first, to notes/frequencies.txt.",
        files,
        commands,
        " the",
        # `uniq -c` right-aligns the count: "     12 the".
        done_line=rf" *{the} the",
        counts={"wc -w notes/field-notes.txt": [str(len(text.split())), "notes/field-notes.txt"]},
    )


TERMINAL_TASKS: list[Callable[[random.Random], ShellTask]] = [
    task_largest_log,
    task_count_errors,
    task_fix_script,
    task_backup,
    task_csv_report,
    task_config_edit,
    task_organize,
    task_find_todos,
    task_large_files,
    task_dedupe,
    task_scaffold,
    task_json_fix,
    task_run_script,
    task_word_count,
]
