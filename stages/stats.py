"""`simulacra stats`: what the store holds, as tables of plain rows (also the Prefect artifacts).

Not a pipeline stage: it only reads. Each section comes from the stage that owns the numbers.
"""

from typing import Any

from pipeline.store.database import Store
from stages import filter as filter_stage
from stages import score as score_stage
from stages import sft as sft_stage
from stages import split as split_stage


def sources_report(store: Store) -> list[dict[str, Any]]:
    """Per source: records read = added + duplicates + quarantined over the current version of each file (completed
    or in progress; a version a newer one replaced, or whose file left its folder, no longer counts), trajectories
    in the store, how many of them no current version holds (retired: in no pool), and how many of the others the
    filter kept."""
    return store.rows(
        """
        WITH files AS (
            SELECT source, count(*) AS files, sum(records_read) AS records_read, sum(added) AS added,
                   sum(duplicates) AS duplicates, sum(quarantined) AS quarantined
            FROM ingested_files WHERE superseded_at IS NULL GROUP BY source
        ), stored AS (
            SELECT t.source, count(*) AS trajectories, count(r.trajectory_id) AS retired,
                   sum(t.num_turns) FILTER (WHERE r.trajectory_id IS NULL) AS turns,
                   count(f.trajectory_id) FILTER (WHERE r.trajectory_id IS NULL) AS judged,
                   count(*) FILTER (WHERE f.kept AND r.trajectory_id IS NULL) AS kept,
                   sum(f.kept_turns) FILTER (WHERE f.kept AND r.trajectory_id IS NULL) AS kept_turns
            FROM trajectories t LEFT JOIN filter_state f USING (trajectory_id)
            LEFT JOIN retired_trajectories r USING (trajectory_id) GROUP BY t.source
        )
        SELECT source, coalesce(files, 0) AS files, coalesce(records_read, 0) AS records_read,
               coalesce(added, 0) AS added, coalesce(duplicates, 0) AS duplicates,
               coalesce(quarantined, 0) AS quarantined, coalesce(trajectories, 0) AS trajectories,
               coalesce(retired, 0) AS retired, coalesce(turns, 0) AS turns,
               coalesce(judged, 0) AS judged, coalesce(kept, 0) AS kept, coalesce(kept_turns, 0) AS kept_turns
        FROM (SELECT DISTINCT source FROM ingested_files) s LEFT JOIN files USING (source) LEFT JOIN stored USING (source)
        ORDER BY source
        """
    )


def domains_report(store: Store) -> list[dict[str, Any]]:
    return store.rows(
        """
        SELECT t.domain, count(*) AS trajectories, sum(t.num_turns) AS turns,
               count(*) FILTER (WHERE f.kept) AS kept, coalesce(sum(f.kept_turns) FILTER (WHERE f.kept), 0) AS kept_turns
        FROM trajectories t LEFT JOIN filter_state f USING (trajectory_id)
        GROUP BY t.domain ORDER BY t.domain
        """
    )


def quarantine_report(store: Store) -> list[dict[str, Any]]:
    return store.rows(
        """
        SELECT source, regexp_replace(error, '[0-9]+', 'N', 'g') AS error, count(*) AS records
        FROM quarantine GROUP BY ALL ORDER BY records DESC, source LIMIT 50
        """
    )


def collect(store: Store) -> dict[str, list[dict[str, Any]]]:
    return {
        "sources": sources_report(store),
        "domains": domains_report(store),
        "quarantine": quarantine_report(store),
        "drops by rule": filter_stage.drops_by_rule(store),
        "categories": score_stage.category_report(store),
        "pools": split_stage.pool_report(store),
        "eval overlap": split_stage.overlap_report(store),
        "sft retention": sft_stage.retention_report(store),
    }
