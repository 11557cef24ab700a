"""`EndpointConfig`: every field documented, defaults that run offline, mistakes named."""

import pytest
from pydantic import ValidationError

from pipeline.config.llm import EndpointConfig


def test_every_field_says_what_it_does():
    assert [name for name, field in EndpointConfig.model_fields.items() if not field.description] == []


def test_the_default_is_the_local_cpt_checkpoint_and_holds_no_key():
    config = EndpointConfig()
    assert (config.backend, config.model, config.api_key_env, config.api_key_secret) == (
        "transformers",
        None,
        "OPENAI_API_KEY",
        None,
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"backend": "openai"}, "backend `openai` needs `model`"),
        ({"backend": "vllm"}, "Input should be 'openai' or 'transformers'"),
        ({"api_key": "sk-..."}, "Extra inputs are not permitted"),  # a key in the config is refused
        ({"concurrency": 0}, "greater than or equal to 1"),
        ({"max_failed_fraction": 1.5}, "less than or equal to 1"),
    ],
)
def test_mistakes_are_refused_with_the_reason(fields, message):
    with pytest.raises(ValidationError, match=message):
        EndpointConfig(**fields)
