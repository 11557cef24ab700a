"""Eval targets seen in training (issue 17, item 15): a target whose exact (action, observation) pair is a
kept turn of a training pool (cpt, sft, rl) of the workspace is partly recall, not simulation.

The rule is the split's (stages/split.py, `overlap_report`): the training side is every kept turn, not
only targets, since SFT and RL queries show their whole history and CPT trains on whole trajectories.
The pools are always the workspace's, also for `--data` files: they are what the checkpoints trained
on. The table reports every score over all targets and over the unseen ones (`score_unseen`), with the
number seen (`seen`), so a gain that is recall reads as one (demo, before: the retrieval baseline scored
60.2 on the seen targets and 20.8 on the rest).
"""

from collections.abc import Sequence

from pipeline.sft.queries import Query

TRAINING_POOLS = ("cpt", "sft", "rl")


def seen_in_training(store, queries: Sequence[Query]) -> frozenset[str]:
    """The query ids whose (action, reference) pair is a kept turn of a training pool. Only the asked
    pairs are looked up, so the join is as small as the eval set."""
    if not queries:
        return frozenset()
    found = store.execute(
        """WITH asked AS (SELECT unnest(?::VARCHAR[]) AS action, unnest(?::VARCHAR[]) AS observation)
           SELECT DISTINCT a.action, a.observation FROM asked a
           JOIN kept_turns k ON k.action = a.action AND k.observation = a.observation
           JOIN splits s USING (trajectory_id)
           WHERE s.pool IN (SELECT unnest(?::VARCHAR[]))""",
        [[q.action for q in queries], [q.reference for q in queries], list(TRAINING_POOLS)],
    ).fetchall()
    pairs = set(found)
    return frozenset(q.query_id for q in queries if (q.action, q.reference) in pairs)
