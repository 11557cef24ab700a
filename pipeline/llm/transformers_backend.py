"""The `transformers` backend: a local Hugging Face causal LM (the CPT checkpoint by default),
decoded in this process, on the GPU when there is one.

Prompts are rendered as training renders them (or by the tokenizer's chat template for a non-ChatML
model) with the generation prompt, and an answer ends at `<|im_end|>` or the end-of-sequence token.
Requests are rows of a continuous batch (pipeline/llm/batching.py, the decoder `simulacra serve` uses):
up to `batch_size` decode together, a row that ends leaves at once and a waiting one is prefilled into
its place. `generate` would hold every row of a batch to the end of its longest, and a 135M model's
answers to one batch of the demo's queries run from 3 to 320 tokens. For throughput on a GPU worker,
serve the checkpoint with `vllm serve` and use the `openai` backend instead (README, "LLM endpoints");
this backend is the no-server path and the one the tests run on the tiny model.

A request with a `thinking_budget` is answered with budget forcing (s1) in one `generate` call: the
answer is opened with `<think>`, the model thinks until it closes the block or spends the budget, then
the block is closed for it (`BudgetForcing`, a logits processor: no second prefill) and it writes the
observation that follows its thinking.

A row that loops (one short unit repeated, pipeline/llm/repetition.py) is ended there unless the
endpoint's `stop_on_repetition` is None.

Seeds: with `seed` set, each request samples from its own generator, seeded from the seed and what the
request asks, so it gets the same answer in whatever batch it is decoded (float rounding of a
differently padded batch may rarely move a sampled token). A budget-forced batch samples from torch's
global generator, seeded per batch. The cache makes reruns consistent regardless: an answer, once
stored, is what every later run gets.
"""

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from pipeline.config.llm import EndpointConfig
from pipeline.llm.chat import ChatRequest, Completion
from pipeline.llm.devices import resolve_device
from pipeline.llm.retry import EndpointError
from pipeline.llm.thinking_format import THINK_CLOSE, THINK_OPEN

if TYPE_CHECKING:  # imported where used: it imports torch
    from pipeline.llm.batching import Scheduler

Send = Callable[[list[ChatRequest]], Awaitable[list[Completion]]]


def request_seed(seed: int | None, request: ChatRequest) -> int | None:
    """A row's sampling seed: a function of the configured seed and what the request asks (its messages
    and sample index), so a request gets the same sample in whatever batch it is decoded; None (a fresh
    random one) without a configured seed."""
    if seed is None:
        return None
    asked = [seed, list(map(dict, request.messages)), request.sample_index]
    return int(hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16], 16)


def _settle(future, step) -> None:
    if not future.done():
        future.set_result(step)


def batch_seed(seed: int, requests: list[ChatRequest]) -> int:
    """A seed for one batch: a function of the configured seed and what the batch asks."""
    asked = [[list(map(dict, r.messages)), r.sample_index] for r in requests]
    digest = hashlib.sha256(json.dumps([seed, asked], sort_keys=True).encode()).hexdigest()
    return int(digest[:8], 16)


def int8_weights(model):
    """The model with every linear layer's weights in int8, one scale per output channel, activations quantized
    per batch as they come (torch's dynamic quantization: fbgemm kernels, CPU only). Decoding a small model
    on a CPU is bound by reading its weights each step; a quarter of the bytes is most of the gain."""
    import warnings

    import torch

    if next(model.parameters()).device.type != "cpu":
        raise ValueError(
            "transformers backend: `quantize: int8` runs on a CPU only (set `device: cpu`, or leave it unset on a GPU)"
        )
    # torch.ao.quantization announces its move to torchao (not a dependency here); torch 2.13, the pinned
    # version, has it whole, and tests/test_llm_transformers.py fails the day a torch upgrade removes it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


class TransformersBackend:
    name = "transformers"
    # Two batches in flight: one decoding, the next waiting in the scheduler, so a row that finishes is
    # replaced at once. Four measured no faster (bench/batches_in_flight.py: 197 s against 180 s on 24 sampled
    # demo requests). Budget-forced requests (one `generate` call each batch) take turns.
    max_in_flight = 2

    def __init__(self, endpoint: EndpointConfig):
        if not endpoint.model:
            raise ValueError("transformers backend: `model` is not set (the stage resolves None to the CPT checkpoint)")
        self.endpoint = endpoint
        self.batch_size = endpoint.batch_size
        self._loaded: tuple[Any, Any, list[int]] | None = None
        self.scheduler: Scheduler | None = (
            None  # the continuous batch of the open connection (its counters stay after it)
        )

    def __repr__(self) -> str:
        return f"TransformersBackend(model={self.endpoint.model!r})"

    def _load(self) -> tuple[Any, Any, list[int]]:
        """Model, tokenizer and stop token ids, loaded once per client."""
        if self._loaded is None:
            from pipeline.llm.packed_attention import use_packed_attention
            from pipeline.training.models import load_causal_lm, load_tokenizer
            from pipeline.training.tiny_model import IM_END

            ref = str(self.endpoint.model)
            device = resolve_device(self.endpoint.device, f"the `device` of the transformers endpoint for {ref}")
            tokenizer = load_tokenizer(ref)
            if not tokenizer.chat_template:
                raise ValueError(f"transformers backend: the tokenizer of {ref} has no chat template")
            tokenizer.padding_side = "left"
            model = use_packed_attention(load_causal_lm(ref).to(device).eval())
            if self.endpoint.quantize == "int8":
                model = int8_weights(model)
            stops = {tokenizer.eos_token_id}
            if IM_END in tokenizer.get_vocab():
                stops.add(tokenizer.convert_tokens_to_ids(IM_END))
            self._loaded = (model, tokenizer, sorted(s for s in stops if s is not None))
        return self._loaded

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Send]:
        from pipeline.llm.batching import Scheduler

        model, tokenizer, stops = await asyncio.to_thread(self._load)
        scheduler = self.scheduler = Scheduler(
            model,
            tokenizer,
            stops,
            max_batch=self.batch_size,
            draft_tokens=self.endpoint.draft_tokens,
            kv_cache_gib=self.endpoint.kv_cache_gib,
        )
        one_generate = asyncio.Lock()

        async def send(requests: list[ChatRequest]) -> list[Completion]:
            # In a thread: torch releases the GIL, so the event loop keeps writing answers meanwhile.
            try:
                if any(r.thinking_budget for r in requests):
                    async with one_generate:
                        return await asyncio.to_thread(self._generate, requests)
                return await self._decode(scheduler, requests)
            except RuntimeError as exc:  # CUDA out of memory and the like: a failure, not a crash
                raise EndpointError("generate", str(exc).splitlines()[0], retryable=False) from None

        try:
            yield send
        finally:
            await asyncio.to_thread(scheduler.close)

    def _prompt_ids(self, requests: list[ChatRequest], prefix: str) -> list[list[int]]:
        """Each request's prompt ids. For a ChatML model, built piece by piece as training builds its
        sequences (pipeline/serving/chatml.py): a literal `<|im_end|>` inside an action stays text, as the
        model saw it in training, instead of becoming the end of the turn (issue 17.17). Any other model:
        its own chat template, rendered and tokenised (the template writes every special token it expects)."""
        from pipeline.serving.chatml import PromptTokens
        from pipeline.training.tiny_model import IM_START

        _, tokenizer, _ = self._load()
        suffix = tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
        if IM_START not in tokenizer.get_vocab() or IM_START not in (tokenizer.chat_template or ""):
            prompts = [
                tokenizer.apply_chat_template(list(map(dict, r.messages)), tokenize=False, add_generation_prompt=True)
                + prefix
                for r in requests
            ]
            return [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in prompts]
        builder = PromptTokens(tokenizer, thinking=False)  # history observations are the environment's, never thinking
        return [builder.ids([dict(m) for m in r.messages]) + suffix for r in requests]

    def _prompt_batch(self, requests: list[ChatRequest], prefix: str):
        """The prompts left-padded into one batch (a decoder continues from the right end of each row)."""
        import torch
        from transformers import BatchEncoding

        _, tokenizer, _ = self._load()
        rows = self._prompt_ids(requests, prefix)
        width = max(map(len, rows))
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
        attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
        return BatchEncoding({"input_ids": input_ids, "attention_mask": attention_mask})

    async def _decode(self, scheduler, requests: list[ChatRequest]) -> list[Completion]:
        """The requests as rows of the continuous batch: each leaves it when it ends, and a waiting row
        (the client keeps a second batch queued, `max_in_flight`) takes its place."""
        from pipeline.llm.batching import Row, Sampling

        _, tokenizer, stops = self._load()
        loop = asyncio.get_running_loop()
        prompts = await asyncio.to_thread(self._prompt_ids, requests, "")
        endpoint = self.endpoint
        done: list[asyncio.Future] = []
        rows = []
        for request, prompt in zip(requests, prompts):
            finished = loop.create_future()

            def listener(step, finished=finished) -> None:  # on the decoding thread
                if step.finish_reason is not None:
                    try:
                        loop.call_soon_threadsafe(_settle, finished, step)
                    except RuntimeError:  # the loop closed: the caller stopped waiting (ctrl-C)
                        pass

            sampling = Sampling(
                max_tokens=endpoint.max_tokens,
                temperature=endpoint.temperature,
                top_p=endpoint.top_p,
                seed=request_seed(endpoint.seed, request),
                stop_on_repetition=endpoint.stop_on_repetition,
            )
            rows.append(Row(prompt=prompt, sampling=sampling, choice=0, listener=listener))
            done.append(finished)
        scheduler.submit(rows)
        try:
            steps = await asyncio.gather(*done)
        except BaseException:  # cancelled (ctrl-C, a failed sibling batch): the rows leave the batch
            for row in rows:
                row.cancel()
            raise
        completions = []
        for row, prompt, step in zip(rows, prompts, steps):
            if step.finish_reason == "error":
                raise EndpointError("generate", step.error or "decoding failed", retryable=False)
            # Up to and including the first stop token, as `generate` counts it.
            end = next((i + 1 for i, token in enumerate(row.generated) if token in stops), len(row.generated))
            text = tokenizer.decode(row.generated[:end], skip_special_tokens=True)
            completions.append(Completion(text=text, prompt_tokens=len(prompt), completion_tokens=end))
        return completions

    def _generate(self, requests: list[ChatRequest]) -> list[Completion]:
        import torch
        from transformers import LogitsProcessorList

        model, tokenizer, stops = self._load()
        budget = max((r.thinking_budget or 0) for r in requests)  # a stage sends one kind of request at a time
        prefix = f"{THINK_OPEN}\n" if budget else ""
        batch = self._prompt_batch(requests, prefix).to(model.device)
        sampling: dict[str, Any] = {"do_sample": self.endpoint.temperature > 0}
        if sampling["do_sample"]:
            sampling.update(temperature=self.endpoint.temperature, top_p=self.endpoint.top_p)
        max_new_tokens = self.endpoint.max_tokens
        if budget:
            forcing = BudgetForcing(tokenizer, batch["input_ids"].shape[1], budget, stops)
            sampling["logits_processor"] = LogitsProcessorList([forcing])
            max_new_tokens += budget + len(forcing.close_ids)
        if self.endpoint.stop_on_repetition is not None:
            from transformers import StoppingCriteriaList

            from pipeline.llm.repetition import RepetitionStop

            loop = RepetitionStop(batch["input_ids"].shape[1], self.endpoint.stop_on_repetition)
            sampling["stopping_criteria"] = StoppingCriteriaList([loop])
        if self.endpoint.seed is not None:
            torch.manual_seed(batch_seed(self.endpoint.seed, requests))
        with torch.inference_mode():
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                eos_token_id=stops,
                pad_token_id=tokenizer.pad_token_id,
                **sampling,
            )
        generated = output[:, batch["input_ids"].shape[1] :].tolist()
        prompt_lengths = batch["attention_mask"].sum(dim=1).tolist()
        completions = []
        for row, prompt_length in zip(generated, prompt_lengths):
            # Up to and including the first stop token; what follows is padding of finished rows. A row
            # ended by the loop stop has no stop token: its padding is what follows its last real token.
            end = next((i + 1 for i, token in enumerate(row) if token in stops), None)
            if end is None:
                end = len(row)
                while end > 0 and row[end - 1] == tokenizer.pad_token_id:
                    end -= 1
            text = prefix + tokenizer.decode(row[:end], skip_special_tokens=True)
            completions.append(Completion(text=text, prompt_tokens=int(prompt_length), completion_tokens=end))
        return completions


class BudgetForcing:
    """A logits processor for answers opened with `<think>` (budget forcing, s1): while a row's thinking
    block is open its answer cannot end; once the row has spent `budget` tokens without closing the
    block itself, the tokens of `\n</think>\n\n` are forced one by one; after that the row writes
    freely (the observation). A row that writes `</think>` itself is closed from then on."""

    def __init__(self, tokenizer, prompt_length: int, budget: int, stop_ids: list[int]):
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.budget = budget
        self.stop_ids = stop_ids
        self.close_ids = tokenizer.encode(f"\n{THINK_CLOSE}\n\n", add_special_tokens=False)
        self.closed: dict[int, bool] = {}
        self.forced_from: dict[int, int] = {}
        # The tag can span tokens: looking this many back finds it wherever it was split.
        self.window = len(tokenizer.encode(THINK_CLOSE, add_special_tokens=False)) + 2

    def __call__(self, input_ids, scores):
        written = input_ids.shape[1] - self.prompt_length
        for row in range(input_ids.shape[0]):
            if self.closed.get(row):
                continue
            start = self.forced_from.get(row)
            if start is None:
                tail = self.tokenizer.decode(
                    input_ids[row, max(self.prompt_length, input_ids.shape[1] - self.window) :]
                )
                if THINK_CLOSE in tail:
                    self.closed[row] = True
                    continue
                if written < self.budget:
                    scores[row, self.stop_ids] = float("-inf")  # thinking must be closed before the answer ends
                    continue
                start = self.forced_from[row] = written
            step = written - start
            if step >= len(self.close_ids):
                self.closed[row] = True
                continue
            forced = self.close_ids[step]
            scores[row, :] = float("-inf")
            scores[row, forced] = 0.0
        return scores
