"""The `gpu` concurrency limit, shared by the DAG (a GPU stage run in its process) and the GPU pool's
flow (flows/gpu_stage.py, a stage dispatched to a GPU worker): whichever runs a GPU stage holds a slot."""

from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.config import SimulacraConfig
from pipeline.config.orchestration import GPU_STAGES


def connected_to_server() -> bool:
    from prefect.settings import get_current_settings

    return get_current_settings().api.url is not None


@contextmanager
def gpu_slot(config: SimulacraConfig, stage: str) -> Iterator[None]:
    """One slot of the global `gpu` concurrency limit while a GPU stage runs (a team's server only:
    the temporary local server of `simulacra run` serves one run, and has no such limit)."""
    limit = config.orchestration.gpu_concurrency_limit
    if stage not in GPU_STAGES or limit is None or not connected_to_server():
        yield
        return
    from prefect.concurrency.sync import concurrency

    with concurrency(limit, occupy=1):
        yield
