"""A file's encoding and compression are detected, so its counts are its records (issue 20.20): a
UTF-16 file has no phantom record from its trailing NUL, a gzip file named .jsonl is decompressed,
a `.jsonl.gz` is read as the JSONL it holds, and the summary says what each was. Real files, a real DuckDB store, both ingestion paths."""

import codecs
import gzip
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.store.database import Store
from stages import ingest

TERMINAL = Path(__file__).resolve().parents[1] / "data" / "demo" / "terminal.jsonl"


def three_records() -> bytes:
    return b"\n".join(TERMINAL.read_bytes().splitlines()[:3]) + b"\n"


CASES = [
    ("utf-16 with a BOM", lambda data: data.decode().encode("utf-16"), "UTF-16"),
    ("utf-16-le without a BOM", lambda data: data.decode().encode("utf-16-le"), "UTF-16 without a byte-order mark"),
    ("utf-16-be with a BOM", lambda data: codecs.BOM_UTF16_BE + data.decode().encode("utf-16-be"), "UTF-16"),
    ("utf-8 with a BOM", lambda data: codecs.BOM_UTF8 + data, "UTF-8 with a byte-order mark"),
    ("gzip named .jsonl", gzip.compress, "gzip-compressed"),
    ("gzip of utf-16", lambda data: gzip.compress(data.decode().encode("utf-16")), "gzip-compressed UTF-16"),
]


@pytest.mark.parametrize("fast_path", [True, False], ids=["sql fast path on", "python path"])
@pytest.mark.parametrize(("encode", "kind"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_the_counts_are_the_files_records_whatever_its_encoding(tmp_path, encode, kind, fast_path):
    path = tmp_path / "exported.jsonl"
    path.write_bytes(encode(three_records()))
    config = load_config(None, [{"workspace": {"path": str(tmp_path / "ws")}, "ingest": {"sql_fast_path": fast_path}}])
    with Store(config.workspace.database_path) as store:
        result = ingest.run(config, store, paths=[str(path)])
        quarantined = store.rows("SELECT error FROM quarantine")
    assert quarantined == []
    assert (result.metrics["records_read"], result.metrics["added"]) == (3, 3)
    assert result.metrics["files_decoded"] == [f"{path} ({kind})"]
    assert f"read as UTF-8 from: {path} ({kind})" in result.summary


def test_a_plain_file_is_not_reported_as_decoded(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_bytes(three_records())
    config = load_config(None, [{"workspace": {"path": str(tmp_path / "ws")}}])
    with Store(config.workspace.database_path) as store:
        result = ingest.run(config, store, paths=[str(path)])
    assert result.metrics["records_read"] == 3 and result.metrics["files_decoded"] == []
    assert "read as UTF-8" not in result.summary


def test_a_gzipped_dataset_named_jsonl_gz_is_read_as_jsonl_in_a_folder_and_alone(tmp_path):
    """How datasets ship JSONL (`train.jsonl.gz`): it was read as one JSON document, and a file of 120 trajectories
        became one quarantined record, "no format adapter recognises this file". In a folder it is found beside the
        plain files, and a source named after it drops both suffixes. A `.gz` whose inner name is no data file (or is
    Parquet, which compresses within) stays out."""
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "train.jsonl.gz").write_bytes(gzip.compress(TERMINAL.read_bytes()))
    (folder / "more.jsonl").write_bytes(three_records())
    (folder / "notes.gz").write_bytes(gzip.compress(b"not data"))
    (folder / "table.parquet.gz").write_bytes(gzip.compress(b"PAR1"))  # pyarrow reads no gzipped Parquet
    config = load_config(None, [{"workspace": {"path": str(tmp_path / "ws")}}])
    with Store(config.workspace.database_path) as store:
        alone = ingest.run(config, store, paths=[str(folder / "train.jsonl.gz")])
        assert (alone.metrics["records_read"], alone.metrics["added"], alone.metrics["quarantined"]) == (120, 120, 0)
        assert store.rows("SELECT DISTINCT source FROM trajectories") == [{"source": "train"}]
        both = ingest.run(config, store, paths=[str(folder)])
        quarantined = store.scalar("SELECT count(*) FROM quarantine")
    assert both.metrics["files_read"] == 2  # the .jsonl.gz and the .jsonl; notes.gz and table.parquet.gz are not data
    # The folder is a source of its own: every record is one the first run added (more.jsonl: its first three).
    assert (both.metrics["records_read"], both.metrics["duplicates"], quarantined) == (123, 123, 0)
