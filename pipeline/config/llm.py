"""Configuration of one endpoint that answers chat requests (issue 10, "One client for every stage
that calls a model").

Not a top-level section: a stage embeds one `EndpointConfig` per role that calls a model (the sft
section's `generator` and `judge`; later the rl judge and evaluation). The API key itself is never a
field: only where to find it (`api_key_env`, `api_key_secret`), so the key cannot reach a config
dump, a section hash or a fingerprint. A `base_url` holding credentials (user info, a key in its
query) is refused: it would be stored whole wherever the config goes (a Prefect flow run's
parameters), and the SDK would send it instead of the Bearer key.
"""

from typing import Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pipeline.config.base import Section

# Query parameters that carry a credential (Azure's `api-key`, `?key=`, signed URLs' `sig`).
CREDENTIAL_PARAMETERS = ("key", "api_key", "api-key", "apikey", "token", "access_token", "secret", "password", "sig")
# The error type `pipeline.config` recognises to leave the offending value out of its message.
CREDENTIALS_IN_URL = "credentials_in_url"


class EndpointConfig(Section):
    backend: Literal["openai", "transformers"] = Field(
        default="transformers",
        description="Default `transformers` with the CPT checkpoint, so the pipeline runs with no endpoint "
        "configured. `openai`: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang, Ollama) "
        "over HTTP. `transformers`: a local Hugging Face causal LM, batched `generate` in this process "
        "(on the GPU when there is one).",
    )
    model: str | None = Field(
        default=None,
        description="openai: the served model name (required). transformers: a local checkpoint folder or "
        "model name; None means the CPT checkpoint, resolved by the stage before it opens the client.",
    )
    api_key_env: str | None = Field(
        default="OPENAI_API_KEY",
        description="openai: name of the environment variable holding the API key (the key itself is never "
        "configured). An unset variable sends no key, which local vLLM/SGLang/Ollama servers accept.",
    )
    api_key_secret: str | None = Field(
        default=None,
        description="openai: name of a Prefect Secret block holding the API key; read only when set, and "
        "then it wins over `api_key_env`.",
    )
    # After the key's fields: its validator names the variable the key belongs in.
    base_url: str | None = Field(
        default=None,
        description="openai: the endpoint's base URL up to `/v1` (e.g. `http://gpu-node:8000/v1` for "
        "`vllm serve`); None means the OpenAI API. Not part of the cache key: the same model served "
        "elsewhere answers the same requests.",
    )
    temperature: float = Field(
        default=1.0,
        ge=0,
        description="Sampling temperature. 1.0 samples the model's own distribution, which rejection "
        "sampling needs (several distinct candidates per prompt); 0 is greedy.",
    )
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass; 1.0 turns it off.")
    max_tokens: int = Field(
        default=1024,
        ge=1,
        description="Most tokens generated per answer; an observation longer than this is cut (the "
        "CPT window, `cpt.max_length`, bounds what the model learnt to produce anyway).",
    )
    seed: int | None = Field(
        default=None,
        description="Sampling seed. Sample k of a prompt is sent with `seed + k`, so its samples differ and "
        "each is reproducible where the endpoint honours seeds (vLLM, SGLang, the transformers backend; "
        "OpenAI only best-effort). None: unseeded.",
    )
    concurrency: int = Field(
        default=32,
        ge=1,
        description="openai: requests in flight at once. 32 keeps a vLLM server's continuous batching busy "
        "without a queue that outlives the timeout, and is where bench/sampling.py measures the client. "
        "(transformers runs one batch of `batch_size` at a time: the device is the limit.)",
    )
    timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Per-request timeout (openai), after which the attempt counts as failed and is retried: "
        "long enough for `max_tokens` tokens from a loaded server, short enough that a hung connection "
        "does not stall a stage.",
    )
    max_retries: int = Field(
        default=5,
        ge=0,
        description="Retries after the first attempt on 429, 5xx, timeouts, dropped connections and "
        "malformed answers; then the request is recorded as failed and the stage goes on.",
    )
    backoff_initial_s: float = Field(
        default=1.0,
        ge=0,
        description="Upper bound of the first retry's wait; it doubles each retry up to `backoff_max_s` and "
        "the actual wait is drawn uniformly below it ('full jitter': concurrent requests that failed together "
        "do not retry together). A Retry-After header from the server sets the wait instead.",
    )
    backoff_max_s: float = Field(
        default=60.0,
        ge=0,
        description="Cap of the exponential backoff; with 5 retries from 1 s the bounds are 1, 2, 4, 8, 16 s.",
    )
    max_failed_fraction: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="A stage fails, naming the endpoint and the commonest error, when more than this share "
        "of its requests failed after retries: a few failures are data loss worth tolerating, many mean a "
        "broken endpoint whose output should not be trained on.",
    )
    batch_size: int = Field(
        default=8,
        ge=1,
        description="transformers: rows decoded together in the continuous batch (pipeline/llm/batching.py). "
        "Decoding reads every weight once a step whatever the rows, so more rows cost little more a step (CPU, "
        "SmolLM2-135M: 8 rows 132 ms, 16 rows 152 ms); the KV cache grows with rows x context. But where a few "
        "long answers decode alone at the end (the demo's 48 SFT candidates: 269 s at 8 rows, 276 s at 24) more "
        "rows gain nothing. 8 keeps a 0.6B model's long contexts within a 24 GB machine.",
    )
    kv_cache_gib: float | None = Field(
        default=None,
        gt=0,
        description="transformers: the KV cache's budget in GiB. Rows join the batch while its rows times its widest "
        "row (prompt plus `max_tokens`: every row's cache is as wide as the widest's) fit; a row alone runs whatever "
        "its width. None: a quarter of the machine's memory on a CPU, no budget on an accelerator (`batch_size` "
        "alone). Long histories (a benchmark's) otherwise pad every row to the longest.",
    )
    stop_on_repetition: int | None = Field(
        default=64,
        ge=8,
        description="transformers: end a row once its last this many generated tokens are one unit of at most a "
        "quarter of them repeated (pipeline/llm/repetition.py). A small model that loops would otherwise write to "
        "`max_tokens`, and hold its whole batch there. None: every row runs to its own end. Ignored by the openai "
        "backend (the server decides).",
    )
    draft_tokens: int = Field(
        default=4,
        ge=0,
        description="transformers: tokens a greedy row may guess ahead each decoding step by prompt lookup (the tokens "
        "that followed the last occurrence of its last few tokens in its prompt or answer: pipeline/llm/prompt_lookup.py), "
        "all checked in the step's one forward pass and kept as far as the model agrees, so the answer is the one "
        "decoded token by token in fewer steps. A world model's answers copy their history (file names, JSON keys, the "
        "end of an observation) and a small model's loops repeat themselves: on the demo's validation pass 128 steps "
        "became 76, its decoding 1.28x faster (bench/prompt_lookup.py). 0: one token a step. Sampled rows never guess.",
    )
    device: str = Field(
        default="auto",
        description="transformers: torch device; `auto` is the first CUDA GPU when there is one, else CPU.",
    )
    quantize: Literal["int8"] | None = Field(
        default=None,
        description="transformers on a CPU: decode with int8 weights (torch's dynamic quantization of every linear "
        "layer, per output channel). On 2 cores, SmolLM2-135M: a decoding step of 8 rows 2x faster, a prefill 1.6x; "
        "but the answers are not the float model's (greedy answers part after about 20 tokens), so it suits "
        "generators whose answers are judged (SFT candidates), never a model being measured. None: float weights.",
    )

    @field_validator("base_url")
    @classmethod
    def _no_credentials_in_url(cls, url: str | None, info) -> str | None:
        if url is None:
            return url
        parts = urlsplit(url)
        named = [
            name for name, _ in parse_qsl(parts.query, keep_blank_values=True) if name.lower() in CREDENTIAL_PARAMETERS
        ]
        if parts.username is None and parts.password is None and not named:
            return url
        where = (
            "user info" if parts.username is not None or parts.password is not None else f"query parameter `{named[0]}`"
        )
        variable = info.data.get("api_key_env") or "OPENAI_API_KEY"
        raise PydanticCustomError(
            CREDENTIALS_IN_URL,
            "the URL holds credentials ({where}): remove them and put the key in the environment variable "
            "{variable} (`api_key_env`), or in a Prefect Secret block (`api_key_secret`)",
            {"where": where, "variable": variable},
        )

    @model_validator(mode="after")
    def _openai_needs_a_model(self) -> "EndpointConfig":
        if self.backend == "openai" and not self.model:
            raise ValueError("backend `openai` needs `model`: the model name the endpoint serves")
        return self
