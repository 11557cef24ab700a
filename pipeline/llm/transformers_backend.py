"""The `transformers` backend: a local Hugging Face causal LM (the CPT checkpoint by default),
batched `generate` in this process, on the GPU when there is one.

Prompts are rendered by the tokenizer's chat template with the generation prompt, left-padded (a
decoder continues from the right end of each row), and generation stops at `<|im_end|>` or the
end-of-sequence token. For throughput on a GPU worker, serve the checkpoint with `vllm serve` and use
the `openai` backend instead (README, "LLM endpoints"); this backend is the no-server path and the
one the tests run on the tiny model.

A request with a `thinking_budget` is answered in two passes (budget forcing, s1): the model
thinks after an opened `<think>` until it closes the block or spends the budget, then the block is
closed for it and it writes the observation that follows its thinking.

Seeds: `generate` samples from torch's global generator, one draw per row of the batch, so a row's
sample depends on its batch mates (and left padding changes numerics slightly anyway). With `seed`
set, each batch is seeded from the seed and its requests, so the same batch gives the same answers;
per-request reproducibility across different batchings is not promised. The cache makes reruns
consistent regardless: an answer, once stored, is what every later run gets.
"""

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from pipeline.config.llm import EndpointConfig
from pipeline.llm.chat import ChatRequest, Completion
from pipeline.llm.retry import EndpointError
from pipeline.sft.candidates import THINK_CLOSE, THINK_OPEN

Send = Callable[[list[ChatRequest]], Awaitable[list[Completion]]]


def _device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def batch_seed(seed: int, requests: list[ChatRequest]) -> int:
    """A seed for one batch: a function of the configured seed and what the batch asks."""
    asked = [[list(map(dict, r.messages)), r.sample_index] for r in requests]
    digest = hashlib.sha256(json.dumps([seed, asked], sort_keys=True).encode()).hexdigest()
    return int(digest[:8], 16)


class TransformersBackend:
    name = "transformers"
    max_in_flight = 1  # one `generate` at a time: the device is the bottleneck, a second would queue

    def __init__(self, endpoint: EndpointConfig):
        if not endpoint.model:
            raise ValueError("transformers backend: `model` is not set (the stage resolves None to the CPT checkpoint)")
        self.endpoint = endpoint
        self.batch_size = endpoint.batch_size
        self._loaded: tuple[Any, Any, list[int]] | None = None

    def __repr__(self) -> str:
        return f"TransformersBackend(model={self.endpoint.model!r})"

    def _load(self) -> tuple[Any, Any, list[int]]:
        """Model, tokenizer and stop token ids, loaded once per client."""
        if self._loaded is None:
            from pipeline.training.models import load_causal_lm, load_tokenizer
            from pipeline.training.tiny_model import IM_END

            ref = str(self.endpoint.model)
            tokenizer = load_tokenizer(ref)
            if not tokenizer.chat_template:
                raise ValueError(f"transformers backend: the tokenizer of {ref} has no chat template")
            tokenizer.padding_side = "left"
            model = load_causal_lm(ref).to(_device(self.endpoint.device)).eval()
            stops = {tokenizer.eos_token_id}
            if IM_END in tokenizer.get_vocab():
                stops.add(tokenizer.convert_tokens_to_ids(IM_END))
            self._loaded = (model, tokenizer, sorted(s for s in stops if s is not None))
        return self._loaded

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Send]:
        await asyncio.to_thread(self._load)

        async def send(requests: list[ChatRequest]) -> list[Completion]:
            # In a thread: torch releases the GIL, so the event loop keeps writing answers meanwhile.
            try:
                return await asyncio.to_thread(self._generate, requests)
            except RuntimeError as exc:  # CUDA out of memory and the like: a failure, not a crash
                raise EndpointError("generate", str(exc).splitlines()[0], retryable=False) from None

        yield send

    def _generate(self, requests: list[ChatRequest]) -> list[Completion]:
        prompts = [
            self._load()[1].apply_chat_template(list(map(dict, r.messages)), tokenize=False, add_generation_prompt=True)
            for r in requests
        ]
        if all(r.thinking_budget is None for r in requests):
            return self._continue(requests, prompts, [""] * len(requests), self.endpoint.max_tokens)
        # A batch is one kind of request (a stage sends its thinking requests together).
        budget = max(r.thinking_budget or 0 for r in requests)
        opened = [f"{THINK_OPEN}\n"] * len(requests)
        thoughts = self._continue(requests, prompts, opened, budget, stop_strings=[THINK_CLOSE])
        closed = [f"{THINK_OPEN}\n{_thinking_of(t.text)}\n{THINK_CLOSE}\n\n" for t in thoughts]
        answers = self._continue(requests, prompts, closed, self.endpoint.max_tokens)
        return [
            Completion(a.text, a.prompt_tokens, (t.completion_tokens or 0) + (a.completion_tokens or 0))
            for t, a in zip(thoughts, answers)
        ]

    def _continue(self, requests: list[ChatRequest], prompts: list[str], prefixes: list[str], max_new_tokens: int,
                  stop_strings: list[str] | None = None) -> list[Completion]:
        """Generate after each prompt and its answer prefix; the text returned starts with the prefix."""
        import torch

        model, tokenizer, stops = self._load()
        # The template already wrote every special token the model expects.
        batch = tokenizer([p + prefix for p, prefix in zip(prompts, prefixes)], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(model.device)
        sampling: dict[str, Any] = {"do_sample": self.endpoint.temperature > 0}
        if sampling["do_sample"]:
            sampling.update(temperature=self.endpoint.temperature, top_p=self.endpoint.top_p)
        if stop_strings:
            sampling.update(stop_strings=stop_strings, tokenizer=tokenizer)
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
        for prefix, row, prompt_length in zip(prefixes, generated, prompt_lengths):
            # Up to and including the first stop token; what follows is padding of finished rows.
            end = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
            text = prefix + tokenizer.decode(row[:end], skip_special_tokens=True)
            completions.append(Completion(text=text, prompt_tokens=int(prompt_length), completion_tokens=end))
        return completions


def _thinking_of(text: str) -> str:
    """The thinking a budget-forced first pass wrote: after `<think>`, up to `</think>` if the model
    closed the block itself (a stop string may end inside a later token: cut there), without the tags."""
    body = text.removeprefix(f"{THINK_OPEN}\n").split(THINK_CLOSE, 1)[0]
    return body.replace(THINK_OPEN, "").strip()
