"""What `simulacra openenv` checks before it imports OpenEnv: that the extra is installed, and what the world
model behind the OpenAI-compatible endpoint is (its name when the endpoint serves one model, its prompt format,
the answer format it was trained in, its history budget), asked once.

Apart from pipeline/serving/openenv_env.py on purpose: that module imports OpenEnv's server package, and with
it gradio (8 of the 11 s its import took on 2 busy cores, `python -X importtime`). So a missing extra, an
endpoint that is not there or a model asked for a format it never learnt is refused before that import, as is a
bad episode file (pipeline/serving/episode.py).
"""

import importlib.util
from dataclasses import dataclass

from pipeline.errors import UserFixableError
from pipeline.serving.environment import WorldModelEnvironment

OPENENV_MISSING = "OpenEnv is not installed (no module `{module}`): pip install '.[openenv]'"


def require_openenv() -> None:
    """The package itself; a module it imports that is missing is named when openenv_env imports it."""
    if importlib.util.find_spec("openenv") is None:
        raise UserFixableError(OPENENV_MISSING.format(module="openenv"))


@dataclass(frozen=True, slots=True)
class ServedWorldModel:
    url: str  # the endpoint's /v1 URL
    model: str
    prompt_format: str
    max_history_chars: int | None
    thinking: bool  # answers in the thinking format


def served_model_name(url: str, api_key: str) -> str:
    """The one model the endpoint serves; several are a choice the user makes with --model."""
    from openai import OpenAI

    with OpenAI(base_url=url, api_key=api_key, max_retries=2) as client:
        names = [entry.id for entry in client.models.list().data]
    if len(names) != 1:
        raise UserFixableError(f"{url} serves {len(names)} models ({', '.join(names)}): pass --model")
    return names[0]


def probe_world_model(
    url: str,
    domain: str,
    *,
    model: str | None = None,
    prompt_format: str | None = None,
    max_history_chars: int | None = None,
    api_key: str = "EMPTY",
    enable_thinking: bool | None = None,
) -> ServedWorldModel:
    """Asks the endpoint once. `prompt_format` and `max_history_chars` are for vLLM, which cannot say them
    (`simulacra serve` does); `enable_thinking` asks for an answer format, else the one the model was trained in."""
    import openai

    try:
        model = model or served_model_name(url, api_key)
        probe = WorldModelEnvironment(
            url, model, domain, prompt_format, max_history_chars, api_key, enable_thinking=enable_thinking
        )
    except openai.APIConnectionError:
        raise UserFixableError(
            f"no world model answers at {url}: start one with `simulacra serve DIR` "
            "(or vLLM) and pass its /v1 URL as --world-model"
        ) from None
    except ValueError as exc:  # not `simulacra serve` and no prompt format given, or an untrained answer format
        raise UserFixableError(str(exc)) from None
    probe.client.close()
    return ServedWorldModel(url, model, probe.format.name, probe.max_history_chars, probe.thinking)
