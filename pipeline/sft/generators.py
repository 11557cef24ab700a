"""The configured generators and judge, built for one run: labels, clients, the retrieval index."""

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config.sft import GeneratorConfig, JudgeConfig
from pipeline.llm.cache import model_key
from pipeline.llm.thinking_format import render_thinking_output
from pipeline.rewards.semantic import SCORER_VERSION
from pipeline.sft.queries import Query
from pipeline.sft.rationale import observation_messages, rationale_messages, rationale_prompt_digest, rationale_text
from pipeline.sft.sampling import (
    GeneratedText,
    Generator,
    digest,
    generator_messages,
    generator_prompt_digest,
    judge_files_digest,
)

if TYPE_CHECKING:
    from pipeline.llm.chat import ChatAnswer


def resolved_endpoint(endpoint, base_ref: str):
    """A transformers endpoint without a model runs the model SFT starts from (the CPT checkpoint)."""
    if endpoint.backend == "transformers" and endpoint.model is None:
        return endpoint.model_copy(update={"model": base_ref})
    return endpoint


# The rationale request's token budget when `thinking_budget` is None: the prompt's one to three sentences.
DEFAULT_RATIONALE_TOKENS = 96
# Rows a local model decodes rationales in at once. A rationale request is short (about 170 prompt tokens, at
# most its budget in answer), so a step of many rows costs little more than one of few: the demo's 48 took
# 45 s at 48 rows against 79 s at 8 (same answers). Observations keep the endpoint's `batch_size`: their long
# prompts and tails gain nothing from more rows (README, "Performance").
RATIONALE_BATCH_ROWS = 48


def thinking_budget(config: GeneratorConfig) -> int | None:
    """The budget a thinking-first generator's requests carry: budget forcing runs on the local backend only."""
    return config.thinking_budget if config.endpoint.backend == "transformers" else None


def rationale_tokens(config: GeneratorConfig) -> int:
    return config.thinking_budget or DEFAULT_RATIONALE_TOKENS


def _output_shaping(endpoint) -> tuple:
    """What changes an endpoint's answers (the cache key's view): not its URL, key or concurrency, nor
    a local model's path (its content: a moved workspace keeps its candidates)."""
    model = model_key(endpoint.backend, endpoint.model)
    shaping = (endpoint.backend, model, endpoint.temperature, endpoint.top_p, endpoint.max_tokens, endpoint.seed)
    # Only when on, so the labels (and candidates) of float generators stay what they were.
    return shaping + (("quantize", endpoint.quantize),) if endpoint.quantize is not None else shaping


def generator_label(config: GeneratorConfig, base_ref: str, pools: str) -> str:
    if config.kind == "retrieval":
        # The index is the cpt pool: a changed pool retrieves differently.
        return f"retrieval#{digest(config.history_turns, pools)}"
    endpoint = resolved_endpoint(config.endpoint, base_ref)
    model = model_key(endpoint.backend, endpoint.model)
    if config.rationale:
        shaping: tuple[object, ...] = (
            _output_shaping(endpoint),
            "rationale",
            rationale_prompt_digest(),
            rationale_tokens(config),
        )
    else:
        shaping = (_output_shaping(endpoint), generator_prompt_digest(), thinking_budget(config))
    return f"{endpoint.backend}:{model}#{digest(*shaping)}"


def judge_label(config: JudgeConfig) -> str:
    if config.kind == "semantic":
        return f"semantic#{digest(SCORER_VERSION)}"
    endpoint = config.endpoint
    return f"llm:{endpoint.backend}:{endpoint.model}#{digest(_output_shaping(endpoint), config.history_turns, judge_files_digest())}"


def _retrieval(config: GeneratorConfig, snapshot_dir: Path):
    index = None

    def generate(items: list[tuple[Query, int]]) -> list[GeneratedText]:
        nonlocal index
        if index is None:
            from pipeline.sft.retrieval import RetrievalIndex

            index = RetrievalIndex(snapshot_dir, config.history_turns)
        queries = list({query.query_id: query for query, _ in items}.values())
        found = dict(zip((q.query_id for q in queries), index.neighbours(queries, config.samples)))
        texts = []
        for query, k in items:
            neighbour, similarity = found[query.query_id][k]
            texts.append(GeneratedText(index.candidate_text(query, neighbour, similarity, k)))
        return texts

    return generate


def _endpoint(endpoint, budget: int | None, store, role: str):
    from pipeline.llm.client import ChatRequest, open_client

    client = open_client(endpoint, store, role)

    def generate(items: list[tuple[Query, int]]) -> list[GeneratedText]:
        requests = [
            ChatRequest(generator_messages(query), sample_index=k, thinking_budget=budget) for query, k in items
        ]
        answers = client.complete_sync(requests)
        return [GeneratedText(a.text, a.error, a.prompt_tokens, a.completion_tokens) for a in answers]

    return generate, client


def _rationale_endpoint(endpoint, tokens: int, store, role: str):
    """Rationale mode (pipeline/sft/rationale.py): the observations, then a thinking block for each. Two
    clients of the same model, since a request's token budget is its endpoint's; both cache their answers,
    so a rerun after a failed rationale asks for that rationale only."""
    from pipeline.llm.client import ChatRequest, open_client

    observer = open_client(endpoint, store, role)
    wider = {"batch_size": max(endpoint.batch_size, RATIONALE_BATCH_ROWS)} if endpoint.backend == "transformers" else {}
    # The thinking that is taught comes from the float model even when the observations are sampled with int8
    # weights: the demo's int8 rationales read "user\nHow does the action answer the question you answer.",
    # its float ones "The cabinet 1 is open." (README, SFT). Observations only compete for selection, and the
    # target observation is always the real one.
    explainer = open_client(
        endpoint.model_copy(update={"max_tokens": tokens, "quantize": None, **wider}), store, f"{role}.rationale"
    )

    def generate(items: list[tuple[Query, int]]) -> list[GeneratedText]:
        observed = observer.complete_sync(
            [ChatRequest(observation_messages(query), sample_index=k) for query, k in items]
        )
        asked = [
            (i, ChatRequest(rationale_messages(query, observed[i].text), sample_index=k))  # type: ignore[arg-type]  # the if below: not None
            for i, (query, k) in enumerate(items)
            if observed[i].text is not None
        ]
        explained = dict(zip((i for i, _ in asked), explainer.complete_sync([request for _, request in asked])))
        texts = []
        for i, seen in enumerate(observed):
            why: ChatAnswer = explained.get(i)  # type: ignore[assignment]  # None only where seen.text is, tested first
            if seen.text is None or why.text is None:
                texts.append(GeneratedText(None, seen.error if seen.text is None else why.error))
                continue
            texts.append(
                GeneratedText(
                    render_thinking_output(rationale_text(why.text), seen.text),
                    None,
                    _total(seen.prompt_tokens, why.prompt_tokens),
                    _total(seen.completion_tokens, why.completion_tokens),
                )
            )
        return texts

    return generate, [observer, explainer]


def _total(first: int | None, second: int | None) -> int | None:
    return None if first is None or second is None else first + second


def build_generators(configs: list[GeneratorConfig], store, snapshot_dir: Path, base_ref: str, pools: str):
    """The run's generators, and the LLM clients among them (their failure tallies are checked at the end)."""
    generators, clients = [], []
    order = 0
    for position, config in enumerate(configs):
        label = generator_label(config, base_ref, pools)
        if config.kind == "retrieval":
            generate = _retrieval(config, snapshot_dir)
        else:
            endpoint = resolved_endpoint(config.endpoint, base_ref)
            if config.rationale:
                generate, both = _rationale_endpoint(
                    endpoint, rationale_tokens(config), store, f"sft.generator.{position}"
                )
                clients += both
            else:
                generate, client = _endpoint(endpoint, thinking_budget(config), store, f"sft.generator.{position}")
                clients.append(client)
        generators.append(Generator(label, config.samples, order, generate))
        order += config.samples
    labels = [g.label for g in generators]
    if len(set(labels)) != len(labels):
        raise ValueError(
            "sft.generators: two generators are the same (same kind, model and sampling); give one more samples instead"
        )
    return generators, clients


def build_judge(config: JudgeConfig, store):
    """The judge, and its LLM client (None for the similarity judge)."""
    from pipeline.sft.judging import LLMJudge, SemanticJudge

    if config.kind == "semantic":
        return SemanticJudge(), None
    from pipeline.llm.client import open_client

    client = open_client(config.endpoint, store, "sft.judge")
    return LLMJudge(client, config.history_turns), client
