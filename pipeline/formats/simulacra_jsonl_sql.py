"""The fast path for the project's own JSONL: DuckDB checks and extracts whole chunks of lines.

The Python adapter (`simulacra_jsonl.Adapter`) stays the specification. A chunk of lines goes to
DuckDB, which keeps a line only when it can tell the adapter would accept it and read the same
values. The checks are deliberately conservative: every line they do not keep is handed back to
the caller, which runs it through the Python adapter (so a quarantine reason is always the
adapter's own). Kept lines get their content id here, as `Trajectory.content_id` defines it:
DuckDB writes the header and length block, and Python's SHA-256 (several times faster than
DuckDB's) reads the turns' text straight from the Arrow buffers DuckDB returns. `insert_chosen`
then copies the new ones into the store from those same buffers: each line is parsed once.

Where DuckDB's JSON reader is more lenient than orjson's, or reads differently, the line is routed:
- trailing commas (DuckDB accepts them): a regex over the line, which may also match inside a
  string (a routed line is only slower);
- unknown keys (their values are never checked) and duplicate keys (DuckDB keeps the first,
  Python the last): `json_keys` of the line, its system prompt and its turns;
- a non-string where text is expected: DuckDB renders it as text (`7`, `true`, `{"a":1}`), so
  text that is such a rendering is routed (scalars that are valid JSON, minified objects/arrays);
- NaN / Infinity, out-of-range or huge numbers: they can only sit in `outcome_reward` (checked as
  a number in range), or inside `metadata` / `tools`, whose JSON text Python re-reads with orjson
  at the depth it has in the line (orjson's nesting limit counts from the line's root);
- `metadata` that orjson would write differently from DuckDB (escapes, number forms).
"""

import hashlib
import sys
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa

from pipeline.formats.jsonl_lines import ARROW_BATCH_ROWS, LineChunk, int64_array, line_table
from pipeline.store.schema import CONTENT_ID_CHARS, DOMAINS, RecordError, canonical_tools, content_field

FORMAT = "simulacra-jsonl"

TOP_KEYS = ["schema", "domain", "task", "system", "turns", "outcome_reward", "metadata"]
SYSTEM_KEYS = [
    "task_description",
    "action_space",
    "tools",
    "initial_state",
    "demonstrations",
    "simulation_instructions",
]
TURN_KEYS = ["action", "observation", "tool_name", "is_error", "metadata"]
TEXT_PARTS = ["action_space", "initial_state", "demonstrations", "simulation_instructions"]

# JSON-typed fields keep their JSON text, so a check can tell an object from a string and `true`
# from `"true"`; text fields are read as VARCHAR and checked with `simulacra_json_like`.
TURN_STRUCTURE = {
    "action": "VARCHAR",
    "observation": "VARCHAR",
    "tool_name": "VARCHAR",
    "is_error": "JSON",
    "metadata": "JSON",
}
LINE_STRUCTURE = orjson.dumps(
    {
        "schema": "VARCHAR",
        "domain": "VARCHAR",
        "task": "VARCHAR",
        "system": "JSON",
        "turns": [TURN_STRUCTURE],
        "outcome_reward": "JSON",
        "metadata": "JSON",
    }
).decode()
SYSTEM_STRUCTURE = orjson.dumps({key: "JSON" if key == "tools" else "VARCHAR" for key in SYSTEM_KEYS}).decode()

# DuckDB renders a non-string value read as VARCHAR as JSON text: a scalar (`7`, `true`, `1e-05`)
# or minified JSON. Text of either form cannot be told from such a rendering.
JSON_LIKE_MACRO = """
CREATE OR REPLACE TEMP MACRO simulacra_json_like(x) AS
    CASE WHEN json_valid(x) THEN NOT (starts_with(x, '{') OR starts_with(x, '[')) OR json(x) = x ELSE false END
"""
REWARD_NUMBER = r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?"


def _sql_list(values: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _text_ok(expression: str) -> str:
    return f"({expression} IS NULL OR NOT simulacra_json_like({expression}))"


def _keys_ok(keys: str, allowed: list[str]) -> str:
    return f"(list_has_all({_sql_list(allowed)}, {keys}) AND len(list_distinct({keys})) = len({keys}))"


def _within(expression: str, cap: int | None) -> str:
    # Caps count characters, as Python's len(); a string of at most `cap` bytes needs no counting.
    return "" if cap is None else f" AND (strlen({expression}) <= {int(cap)} OR length({expression}) <= {int(cap)})"


def _field(expression: str) -> str:
    """SQL of `pipeline.store.schema.content_field`: `N`, or `S<UTF-8 bytes>:<text>`."""
    return f"CASE WHEN {expression} IS NULL THEN 'N' ELSE concat('S', strlen({expression}), ':', {expression}) END"


def check_sql(max_action_chars: int | None, max_observation_chars: int | None) -> str:
    """One row per line that may be JSON: whether the adapter would accept it exactly as read here
    (`ok`), its values as stored, and what its content id hashes."""
    turn_ok = (
        f"t.action IS NOT NULL AND NOT simulacra_json_like(t.action){_within('t.action', max_action_chars)}"
        f" AND t.observation IS NOT NULL AND NOT simulacra_json_like(t.observation)"
        f"{_within('t.observation', max_observation_chars)}"
        f" AND {_text_ok('t.tool_name')}"
        " AND (t.is_error IS NULL OR t.is_error IN ('true', 'false'))"
        " AND (t.metadata IS NULL OR starts_with(t.metadata, '{'))"
    )
    domain = "coalesce($domain, r.domain, 'other')"  # the source's domain wins, as in the adapter
    ok = f"""
        keys IS NOT NULL AND {_keys_ok("keys[1]", TOP_KEYS)} AND (keys[2] IS NULL OR {_keys_ok("keys[2]", SYSTEM_KEYS)})
        AND len(r.turns) > 0
        AND {_text_ok("r.schema")}
        AND (NOT list_contains(keys[1], 'domain') OR (r.domain IS NOT NULL AND NOT simulacra_json_like(r.domain)))
        AND list_contains({_sql_list(DOMAINS)}, {domain})
        AND {_text_ok("r.task")}
        AND (r.system IS NULL OR starts_with(r.system, '{{'))
        AND {" AND ".join(_text_ok(f"s.{key}") for key in ["task_description", *TEXT_PARTS])}
        AND (s.tools IS NULL OR starts_with(s.tools, '['))
        AND (r.outcome_reward IS NULL OR (
            regexp_full_match(r.outcome_reward, '{REWARD_NUMBER}')
            AND NOT regexp_matches(r.outcome_reward, '[0-9]{{20}}')
            AND isfinite(TRY_CAST(r.outcome_reward AS DOUBLE))))
        AND (r.metadata IS NULL OR starts_with(r.metadata, '{{'))
        AND list_bool_and(list_transform(r.turns, lambda t: {turn_ok}))
        -- Turns of one writer share their keys: check each distinct key list once.
        AND list_bool_and(list_transform(list_distinct(turn_keys), lambda k: {_keys_ok("k", TURN_KEYS)}))
        -- A missing is_error means False, an explicit null is an error: the turns whose is_error
        -- reads as NULL must be exactly those without the key (a subset of them).
        AND CASE WHEN list_count(list_transform(r.turns, lambda t: t.is_error)) = len(r.turns) THEN true
            ELSE len(list_filter(r.turns, lambda t: t.is_error IS NULL))
                 = len(list_filter(turn_keys, lambda k: NOT list_contains(k, 'is_error'))) END"""
    # `pipeline.store.schema.content_id`'s text, but for the tools field that Python writes: the header
    # and the length block here, the turns' text as DuckDB's Arrow buffers hold it.
    header = ", ".join(
        [_field("r.task"), _field("coalesce(s.task_description, '')")]
        + [_field(f"s.{key}") for key in TEXT_PARTS]
        + ["'N'", "len(r.turns)", "':'"]
    )
    lengths = ", ".join(
        f"list_transform(r.turns, lambda t: {expression})"
        for expression in (
            "strlen(t.action)",
            "strlen(t.observation)",
            "coalesce(strlen(t.tool_name), -1)",
            "CASE WHEN t.is_error = 'true' THEN 1 ELSE 0 END",
        )
    )
    # Every line comes out with its verdict rather than being filtered: DuckDB pushes a filter
    # below the projection that parses, and then parses the line once per column the filter names.
    return f"""
SELECT line_no,
       coalesce({ok}, false) AS ok,
       concat({header}) AS header,
       list_concat({lengths})::BIGINT[] AS lengths,
       r.turns AS turns,
       {domain} AS domain,
       r.task AS task,
       coalesce(s.task_description, '') AS task_description,
       {", ".join(f"s.{key} AS {key}" for key in TEXT_PARTS)},
       s.tools AS tools_json,
       TRY_CAST(r.outcome_reward AS DOUBLE) AS outcome_reward,
       len(r.turns) AS num_turns,
       nullif(r.metadata, '{{}}') AS metadata,
       list_filter(list_transform(r.turns, lambda t: t.metadata), lambda m: m <> '{{}}') AS turn_metadata
FROM (
    SELECT *, CASE WHEN starts_with(r.system, '{{') THEN from_json(r.system, '{SYSTEM_STRUCTURE}') END AS s
    FROM (
        SELECT line_no,
               try(json_keys(line, ['$', '$.system'])) AS keys,
               try(json_keys(line, '$.turns[*]')) AS turn_keys,
               try(from_json(line, '{LINE_STRUCTURE}')) AS r
        FROM jsonl_lines
        -- DuckDB accepts trailing commas, orjson does not.
        WHERE NOT regexp_matches(line, ',[ \\t\\r]*[\\]}}]')
    )
)
"""


# Lines chosen for the store (new ids, first occurrence: `batch_chosen`) with their id and values.
CHOSEN = """
    FROM jsonl_keys k
    JOIN jsonl_checked c ON c.line_no = k.position
    SEMI JOIN batch_chosen b ON b.position = k.position"""

INSERT_TRAJECTORIES_SQL = f"""
INSERT INTO trajectories (trajectory_id, source, format, domain, task, task_description, action_space, tools,
    initial_state, demonstrations, simulation_instructions, outcome_reward, num_turns, metadata, location, ingested_at)
SELECT k.trajectory_id, $source, '{FORMAT}', c.domain, c.task, c.task_description, c.action_space, tools.stored,
    c.initial_state, c.demonstrations, c.simulation_instructions, c.outcome_reward, c.num_turns, c.metadata,
    $location || c.line_no, now()
{CHOSEN}
LEFT JOIN jsonl_tools tools ON tools.text = c.tools_json
"""

INSERT_TURNS_SQL = f"""
INSERT INTO turns (trajectory_id, turn_index, action, observation, tool_name, is_error, metadata)
SELECT trajectory_id, turn_index - 1, t.action, t.observation, t.tool_name, coalesce(t.is_error = 'true', false),
    nullif(t.metadata, '{{}}')
FROM (
    SELECT k.trajectory_id, unnest(c.turns) AS t, generate_subscripts(c.turns, 1) AS turn_index
    {CHOSEN}
)
"""

REGISTERED = ("jsonl_lines", "jsonl_checked", "jsonl_keys")


def _nested(text: str, depth: int):
    """orjson's reading of a JSON text that sits `depth` levels deep in its line: wrapped in as many
    arrays, it meets orjson's nesting limit where the whole line would."""
    value = orjson.loads("[" * depth + text + "]" * depth)
    for _ in range(depth):
        value = value[0]
    return value


@dataclass
class ToolSchemas:
    """What one distinct `system.tools` JSON text becomes: its stored text and its content field."""

    usable: bool
    stored: str | None = None
    field: str = "N"


def _tool_schemas(text: str) -> ToolSchemas:
    try:
        tools = _nested(text, 2)  # line -> system -> tools
        stored = orjson.dumps(tools, option=orjson.OPT_NON_STR_KEYS).decode() if tools else None
        return ToolSchemas(True, stored, content_field(canonical_tools(tools)))
    except (orjson.JSONDecodeError, orjson.JSONEncodeError, RecordError):
        return ToolSchemas(False)


def _usable_metadata(texts: list[str], depth: int) -> list[bool]:
    """Which of DuckDB's metadata texts are exactly what the Python path stores (orjson's reading,
    written back). All at once when they all are: one orjson call for the whole chunk."""
    joined = ",".join(texts)
    try:
        values = _nested(f"[{joined}]", depth - 1)
        if (
            all(type(value) is dict for value in values)
            and orjson.dumps(values, option=orjson.OPT_NON_STR_KEYS).decode() == f"[{joined}]"
        ):
            return [True] * len(texts)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        pass
    return [_metadata_usable(text, depth) for text in texts]


def _metadata_usable(text: str, depth: int) -> bool:
    try:
        value = _nested(text, depth)
        return isinstance(value, dict) and orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() == text
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return False


@dataclass
class Staged:
    rows: int  # lines keyed in `jsonl_keys`, ready for `insert_chosen`
    routed: list[int]  # indices into the chunk of the lines the Python adapter must read


def stage(
    con, chunk: LineChunk, domain: str | None, max_action_chars: int | None, max_observation_chars: int | None
) -> Staged:
    """Check one chunk and key the lines the adapter would accept as read here. A DuckDB error
    propagates: the caller then routes the whole chunk."""
    con.execute(JSON_LIKE_MACRO)
    con.register("jsonl_lines", line_table(chunk))
    checked = con.sql(check_sql(max_action_chars, max_observation_chars), params={"domain": domain}).to_arrow_table(
        ARROW_BATCH_ROWS
    )
    con.register("jsonl_checked", checked)
    tools = {
        text: _tool_schemas(text)
        for (text,) in con.execute(
            "SELECT DISTINCT tools_json FROM jsonl_checked WHERE ok AND tools_json IS NOT NULL"
        ).fetchall()
    }
    # Small tables travel as list parameters: no pandas import (see `jsonl_lines.line_table`).
    usable = {text: entry for text, entry in tools.items() if entry.usable}
    con.execute(
        "CREATE OR REPLACE TEMP TABLE jsonl_tools AS "
        "SELECT unnest($text::VARCHAR[]) AS text, unnest($stored::VARCHAR[]) AS stored",
        {"text": list(usable), "stored": [entry.stored for entry in usable.values()]},
    )
    positions, ids = _content_ids(checked, tools, set(_refused_metadata_lines(con)))
    con.register("jsonl_keys", pa.Table.from_arrays([int64_array(positions), ids], names=["position", "trajectory_id"]))
    routed = np.flatnonzero(~np.isin(chunk.numbers, positions))
    return Staged(len(positions), [int(i) for i in routed])


def _content_ids(checked: pa.Table, tools: dict[str, ToolSchemas], refused: set[int]) -> tuple[np.ndarray, pa.Array]:
    """The content id of every accepted line, hashed from the Arrow buffers DuckDB returned: the
    tools field, then the byte ranges of the line's header, lengths, actions, observations and
    tool names (each a contiguous run of its column)."""
    # The tools field, hashed once per distinct tool schemas; None when Python must read the line.
    prefixes = {text: hashlib.sha256(entry.field.encode()) if entry.usable else None for text, entry in tools.items()}
    prefixes[None] = hashlib.sha256(b"N")  # type: ignore[index]  # None: a line without a tools field
    positions, digests = [], []
    for batch in checked.to_batches():
        columns = dict(zip(batch.schema.names, batch.columns))
        turns = columns["turns"]
        turn_bounds = _offsets(turns)
        (hd, hs, he), (ld, ls, le), (ad, as_, ae), (od, os_, oe), (td, ts, te) = [
            _byte_ranges(columns["header"], None),
            _byte_ranges(columns["lengths"], None),
            *(_byte_ranges(turns.values.field(name), turn_bounds) for name in ("action", "observation", "tool_name")),
        ]
        # to_pylist, not to_numpy: the latter imports pandas.
        rows = zip(columns["ok"].to_pylist(), columns["line_no"].to_pylist(), columns["tools_json"].to_pylist())
        for i, (ok, number, tools_json) in enumerate(rows):
            prefix = prefixes[tools_json] if ok and number not in refused else None
            if prefix is None:
                continue
            digest = prefix.copy()
            digest.update(hd[hs[i] : he[i]])
            digest.update(ld[ls[i] : le[i]])
            digest.update(ad[as_[i] : ae[i]])
            digest.update(od[os_[i] : oe[i]])
            digest.update(td[ts[i] : te[i]])
            positions.append(number)
            digests.append(digest.hexdigest()[:CONTENT_ID_CHARS])
    # Fixed-width ids: one buffer and arithmetic offsets.
    width = CONTENT_ID_CHARS
    ids = pa.StringArray.from_buffers(
        len(digests),
        pa.py_buffer(np.arange(0, width * (len(digests) + 1), width, dtype=np.int32)),
        pa.py_buffer("".join(digests).encode()),
    )
    return np.array(positions, np.int64), ids


def _offsets(array: pa.Array) -> np.ndarray:
    """The offsets buffer of a list or string array, as int64, from the array's own offset."""
    kind = array.type
    if not any(
        check(kind)
        for check in (pa.types.is_list, pa.types.is_large_list, pa.types.is_string, pa.types.is_large_string)
    ):
        raise TypeError(
            f"DuckDB returned {kind} where a list or string was expected (arrow_output_list_view must be off)"
        )
    wide = pa.types.is_large_list(kind) or pa.types.is_large_string(kind)
    offsets = np.frombuffer(array.buffers()[1], np.int64 if wide else np.int32)
    return offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)


def _byte_ranges(array: pa.Array, rows: np.ndarray | None) -> tuple[memoryview, list[int], list[int]]:
    """(data, starts, ends): per row, the bytes of a string array's elements (or, for a list of
    int64, of its values), the row being elements rows[i]..rows[i+1] when given, else element i."""
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = array.values
        data = memoryview(values.buffers()[1]).cast("B")
        if sys.byteorder != "little":  # content_id hashes the lengths little-endian
            data = memoryview(np.frombuffer(data, np.int64).astype("<i8").tobytes())
        item = values.type.byte_width
        bounds = (_offsets(array) + values.offset) * item
    else:
        data = memoryview(array.buffers()[2] or b"")
        bounds = _offsets(array)
        if rows is not None:
            bounds = bounds[rows]
    return data, bounds[:-1].tolist(), bounds[1:].tolist()


def _refused_metadata_lines(con) -> list[int]:
    """Lines whose trajectory or turn metadata DuckDB would store differently from Python."""
    queries = {
        # kind: (distinct texts, depth in the line: line -> metadata, line -> turns -> turn -> metadata)
        "trajectory": ("SELECT DISTINCT metadata FROM jsonl_checked WHERE ok AND metadata IS NOT NULL", 1),
        "turn": ("SELECT DISTINCT unnest(turn_metadata) FROM jsonl_checked WHERE ok AND len(turn_metadata) > 0", 3),
    }
    refused = {}
    for kind, (query, depth) in queries.items():
        texts = [text for (text,) in con.execute(query).fetchall()]
        refused[kind] = [text for text, usable in zip(texts, _usable_metadata(texts, depth)) if not usable]
    if not refused["trajectory"] and not refused["turn"]:
        return []
    rows = con.execute(
        "SELECT line_no FROM jsonl_checked "
        "WHERE list_contains($trajectory::VARCHAR[], metadata) OR list_has_any($turn::VARCHAR[], turn_metadata)",
        refused,
    ).fetchall()
    return [row[0] for row in rows]


def insert_chosen(con, source: str, location_prefix: str) -> None:
    """Copy the keyed lines named in `batch_chosen` (new ids, first occurrence) into the store."""
    con.execute(INSERT_TRAJECTORIES_SQL, {"source": source, "location": location_prefix})
    con.execute(INSERT_TURNS_SQL)


def drop_staged(con) -> None:
    for name in REGISTERED:
        con.unregister(name)
    con.execute("DROP TABLE IF EXISTS jsonl_tools")
