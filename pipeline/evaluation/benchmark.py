"""`--data` files read as a benchmark (issue 18): their items, their turns, their prompts, scored as given.

A reader, as a datatrove reader yields documents: it parses each file with the format adapters
(pipeline/formats, the ones ingest uses: detected from the file's first document, AgentWorldBench rows
included) and yields one eval item per target turn. Nothing is ingested, filtered, split or re-chosen,
and nothing touches the workspace's store, so evaluating a benchmark is one step.

- Target turns: the turns the data designates, by turn metadata `<target_field>: true` (default
  `benchmark_target`; the AgentWorldBench adapter marks each row's `turn_idx` so). A trajectory that
  designates none has every turn as a target (a thought turn aside: the harness answers those), the
  file taken as given. No `min_turns`, no retry or no-change filter, no first/last/middle choice.
- The system prompt: the row's own (`metadata.system_prompt`, AgentWorldBench's `system_str`) when the
  data carries one, sent verbatim to every model; else the model's trained template.
- The history: every turn before the target, in full, unless `max_history_chars` asks for a cut (then
  the most recent whole turns within it); each item reports how many turns it left out.
- Records that do not parse are counted with their reason (the first few are shown), not quarantined:
  there is no store to quarantine them in. Rows repeating an item already read count as duplicates.
- Repeats: runs of one task often open alike, so two items of different rows can ask one query (the same
  system prompt, history, action and observation). Each query is asked once: in each path's seeded order,
  an item repeating one already taken (of this path or an earlier one) is passed over and counted
  (`repeats`), and the next in order takes its place, so a budget still keeps that many distinct items.
- A budget, when asked (`max_items_per_path`): each `--data` path (a file, or a folder's files together)
  keeps at most that many of its items, a seeded choice ranked as SFT's queries are (`choose_targets`), so
  a rerun keeps the same items and a larger budget a superset; every path keeps its share, so one large
  file does not crowd out the others' domains. The items left out are counted (`capped`).
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from pipeline.errors import UserFixableError
from pipeline.secret_shapes import redact_value
from pipeline.sft.queries import Query, choose_targets, content_key, query_at
from pipeline.store.schema import THOUGHT, RecordError, ScoredTurn, Trajectory

FAILURES_SHOWN = 5


@dataclass(frozen=True, slots=True)
class BenchmarkItem:
    query: Query
    system_prompt: str | None  # the row's own, verbatim; None: the model's trained template
    response_marker: str | None  # a marker the benchmark strips from prediction and reference before scoring


@dataclass(slots=True)
class BenchmarkRead:
    items: list[BenchmarkItem] = field(default_factory=list)
    records_read: int = 0
    records_failed: int = 0
    duplicates: int = 0
    designated: int = 0  # targets designated by the data (read, before the budget)
    every_turn: int = 0  # targets of trajectories that designate none (read, before the budget)
    capped: int = 0  # items read but left out by `max_items_per_path`
    repeats: int = 0  # items passed over for asking the query of an item already taken
    failures: list[str] = field(default_factory=list)  # "location: reason", the first few

    def fail(self, location: str, reason: str) -> None:
        self.records_failed += 1
        if len(self.failures) < FAILURES_SHOWN:
            self.failures.append(f"{location}: {reason}")


def _files(paths: Sequence[str]) -> Iterator[Path]:
    """A file as named; a folder's data files, walked as ingest walks one (`expand`): its LICENSE and README were
    read as records and counted as failing to parse, three of them in `make learn`'s public folders."""
    from pipeline.formats.sources import expand

    for name in paths:
        path = Path(name).expanduser()
        if path.is_dir():
            yield from (Path(found.path) for found in expand(str(path)))
        elif path.is_file():
            yield path
        else:
            raise UserFixableError(f"--data {name}: no such file or folder")


def _trajectories(path: Path, read: BenchmarkRead) -> Iterator[Trajectory]:
    from pipeline import formats
    from pipeline.formats.base import Malformed, iter_documents

    adapter = None
    for document in iter_documents(path):
        if isinstance(document, Malformed):
            read.records_read += 1
            read.fail(document.location, document.error)
            continue
        adapter = adapter or formats.detect(document.content)
        if adapter is None:
            read.records_read += 1
            read.fail(document.location, "no format adapter recognises this file")
            continue
        for record in adapter.records(document):
            read.records_read += 1
            try:
                trajectory = adapter.parse(record.content, None)
            except (RecordError, KeyError, TypeError, ValueError) as exc:
                read.fail(record.location, str(exc))
                continue
            trajectory.location = record.location
            yield _without_credentials(trajectory)


def _without_credentials(trajectory: Trajectory) -> Trajectory:
    """The trajectory with every credential-shaped run redacted, as ingest stores one: benchmark files are read
    without ingesting them, and their text goes into the prompts of the models evaluated and of the judge (an
    endpoint elsewhere, maybe), and into the stored answers and reports."""
    system = trajectory.system
    trajectory.system = replace(
        system, **{part.name: redact_value(getattr(system, part.name)) for part in fields(system)}
    )
    trajectory.task = redact_value(trajectory.task)
    trajectory.metadata = redact_value(trajectory.metadata)
    for turn in trajectory.turns:
        turn.action, turn.observation = redact_value(turn.action), redact_value(turn.observation)
        turn.tool_name, turn.metadata = redact_value(turn.tool_name), redact_value(turn.metadata)
    return trajectory


def file_trajectories(paths: Sequence[str], read: BenchmarkRead) -> Iterator[Trajectory]:
    """Every trajectory of the files (a folder's files in order), parsed as `read_benchmark` parses them, what
    fails counted in `read`: for a reader that needs whole trajectories rather than target turns (closed-loop
    rollouts, pipeline/fidelity/trajectories.py)."""
    for path in _files(paths):
        yield from _trajectories(path, read)


def target_positions(trajectory: Trajectory, target_field: str) -> tuple[list[int], bool]:
    """The positions of the target turns, and whether the data designated them."""
    designated = [i for i, turn in enumerate(trajectory.turns) if turn.metadata.get(target_field) is True]
    turn_idx = trajectory.metadata.get("turn_idx")
    if not designated and isinstance(turn_idx, int) and 1 <= turn_idx <= len(trajectory.turns):
        designated = [turn_idx - 1]  # an AgentWorldBench row read under another target field name
    if designated:
        return designated, True
    return [i for i, turn in enumerate(trajectory.turns) if turn.metadata.get("kind") != THOUGHT], False


def _items(
    path: Path, target_field: str, max_history_chars: int | None, read: BenchmarkRead, seen: set[str]
) -> Iterator[BenchmarkItem]:
    """One file's items, each target turn with its history; an item already read is counted, not repeated."""
    for trajectory in _trajectories(path, read):
        try:
            trajectory_id = trajectory.content_id()
        except RecordError as exc:
            read.fail(trajectory.location, str(exc))
            continue
        turns = [ScoredTurn(i, t.action, t.observation, "", 1.0) for i, t in enumerate(trajectory.turns)]
        positions, designated = target_positions(trajectory, target_field)
        system_prompt = trajectory.metadata.get("system_prompt")
        marker = trajectory.metadata.get("response_marker")
        for position in positions:
            query = query_at(
                trajectory_id,
                trajectory.domain,
                trajectory.system,
                turns[:position],
                turns[position],
                max_history_chars,
            )
            if query.query_id in seen:
                read.duplicates += 1
                continue
            seen.add(query.query_id)
            read.designated += designated
            read.every_turn += not designated
            yield BenchmarkItem(
                query,
                system_prompt if isinstance(system_prompt, str) else None,
                marker if isinstance(marker, str) else None,
            )


def _asked(item: BenchmarkItem) -> str:
    """What a model is asked and scored on: the query's content, the row's own system prompt and marker."""
    return f"{content_key(item.query)}:{item.system_prompt!r}:{item.response_marker!r}"


def chosen_items(
    items: list[BenchmarkItem], limit: int | None, seed: int, taken: set[str] | None = None
) -> tuple[list[BenchmarkItem], int]:
    """The seeded choice of `limit` items (all when None) that repeat no query in `taken` nor one chosen
    before them, in reading order, and how many repeats were passed over. `taken` gains the chosen."""
    taken = set() if taken is None else taken
    by_target = {(item.query.trajectory_id, item.query.turn_index): item for item in items}
    chosen: set[tuple[str, int]] = set()
    repeats = 0
    for target in choose_targets(by_target, None, seed):
        if limit is not None and len(chosen) == limit:
            break
        asked = _asked(by_target[target])
        if asked in taken:
            repeats += 1
            continue
        taken.add(asked)
        chosen.add(target)
    return [item for item in items if (item.query.trajectory_id, item.query.turn_index) in chosen], repeats


def read_benchmark(
    paths: Sequence[str],
    target_field: str,
    max_history_chars: int | None,
    max_items_per_path: int | None = None,
    seed: int = 0,
) -> BenchmarkRead:
    read = BenchmarkRead()
    seen: set[str] = set()
    taken: set[str] = set()
    for name in paths:
        items = [item for path in _files([name]) for item in _items(path, target_field, max_history_chars, read, seen)]
        kept, repeats = chosen_items(items, max_items_per_path, seed, taken)
        read.items += kept
        read.repeats += repeats
        read.capped += len(items) - len(kept) - repeats
    return read


def strip_marker(text: str, marker: str | None) -> str:
    """eval.py's `clean_response_marker`: the marker and the whitespace around the rest removed."""
    if not marker:
        return text
    if text.startswith(marker):
        return text[len(marker) :].strip()
    return text.replace(marker, "").strip()
