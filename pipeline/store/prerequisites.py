"""What a data stage needs the store to hold before it runs, as one line that names the stage to run first.

A stage that found nothing to work on would otherwise report "judged 0 trajectories" and exit 0, and the
user would learn what was missing only from a later stage (or not at all, where they ran just this one)."""

from pipeline.errors import UserFixableError
from pipeline.store.database import Store


def require_ingested(store: Store) -> None:
    """Filtering, scoring and splitting start from ingested trajectories."""
    if not store.scalar("SELECT count(*) FROM trajectories"):
        raise UserFixableError("the store holds no trajectory: run `simulacra ingest` first")


def require_filtered(store: Store) -> None:
    """Scores and pools are of the kept trajectories: before `filter` there are none, and a stage that scores or
    assigns nothing must say why rather than pass as done."""
    require_ingested(store)
    if not store.scalar("SELECT count(*) FROM filter_state"):
        raise UserFixableError("no trajectory has been filtered yet: run `simulacra filter` first")
