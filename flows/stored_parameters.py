"""What Prefect stores of a pipeline flow run's parameters: the overrides, every configured API key redacted.

Prefect keeps a flow run's parameters in its database (`prefect.db`) and shows them in the UI. An
override can hold an endpoint's key where no rule on the URL sees it (`sft.judge.endpoint.base_url=
http://host/v1/<key>`, issue 29.4; user info and `?api_key=` are refused by pipeline/config/llm.py), so
the key each endpoint of the run's config reads from the environment is replaced by `[redacted-secret]`
wherever it appears in a stored override. The run itself is unchanged: Prefect calls the flow with the
parameters it was given, and stores what `serialize_parameters` returns.
"""

from collections.abc import Callable, Iterator
from typing import Any

from prefect import Flow
from pydantic import BaseModel

from flows.dag import resolve_config
from pipeline.config import ConfigError, load_config
from pipeline.config.llm import EndpointConfig
from pipeline.llm.credentials import redact, remember_environment_keys


class PipelineFlow(Flow):
    """A Prefect flow that takes `overrides` and stores them with the configured keys redacted."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        stored = super().serialize_parameters(parameters)
        if stored.get("overrides"):
            remember_environment_keys(endpoints(_run_config(parameters)))
            stored["overrides"] = [redact(override) for override in stored["overrides"]]
        return stored


def redact_stored_overrides() -> None:
    """Rewrite this flow run's stored overrides redacted, if they hold a key. `serialize_parameters` only runs where
    the flow is called in the process (`simulacra run`); a run a deployment starts from the UI or the API is stored
    by Prefect's server as it was typed, and its Parameters tab and `GET /flow_runs/{id}` showed a key in full (found
    by probing). Called first thing in the run, from the parameters the run has stored; outside a flow run it does
    nothing."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    if flow_run is None:
        return
    stored = (flow_run.parameters or {}).get("overrides")
    if not stored or not isinstance(stored, list):
        return
    remember_environment_keys(endpoints(_run_config(flow_run.parameters)))
    redacted = [redact(override) if isinstance(override, str) else override for override in stored]
    if redacted == stored:
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, parameters={**flow_run.parameters, "overrides": redacted})


def pipeline_flow(**options: Any) -> Callable[[Callable[..., Any]], PipelineFlow]:
    """`@flow(...)` for a flow whose `overrides` are stored redacted."""
    return lambda function: PipelineFlow(fn=function, **options)


def _run_config(parameters: dict[str, Any]):
    """The config the run will use; the defaults' when it does not resolve (the run then fails on its own)."""
    try:
        return resolve_config(
            parameters.get("config_path", ""),
            parameters.get("overrides", ()),
            parameters.get("base_model", ""),
            parameters.get("max_steps", 0),
            parameters.get("workspace", ""),
        )
    except ConfigError:
        return load_config(None, [])


def endpoints(section: BaseModel) -> Iterator[EndpointConfig]:
    """Every endpoint a config section holds, at any depth (sft's generators and judge, rl's judge, ...)."""
    for name in type(section).model_fields:
        value = getattr(section, name)
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, EndpointConfig):
                yield item
            elif isinstance(item, BaseModel):
                yield from endpoints(item)
