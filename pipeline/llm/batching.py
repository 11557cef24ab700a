"""Continuous batching: every running row decodes in one forward pass per token. `simulacra serve`
decodes its requests with it (issue 19: 16 concurrent requests were answered one at a time), and so
does the `transformers` LLM backend (pipeline/llm/transformers_backend.py): a row that finishes leaves
the batch at once and a waiting one takes its place, where one `generate` call runs every row to the
end of its longest (a 135M model's answers on the demo run from 3 to 320 tokens in one batch).

One decoding thread owns the model. Each step it
1. admits waiting rows (one row per choice of a request, so `n` = 4 is four rows) up to `max_batch`, while the
   batch's rows times its widest row's prompt and answer budget fit the KV cache's budget (`_admitted`):
   prompts that begin alike run their common beginning once (`prefix_families`: an evaluation pass
   asks many targets of one environment, which share its system prompt, and of one trajectory, which
   share its history too; on 30 of the demo's targets that is 8,098 prompt tokens run as 2,089), the
   rest of each in groups of similar length, each left-padded (`length_groups`: padding is wasted
   work; rows with one prompt, the choices of a request or the K samples of an SFT query, share one
   prefill), and their KV cache (pipeline/llm/kv_cache.py) joins the running batch's, padded on the
   left to the same length (positions are per row, so padding changes nothing but masked columns);
2. runs one forward pass for the whole batch and picks each row's next token with the row's own
   sampling: logit bias and presence / frequency penalties, then greedy at temperature 0, else
   temperature and top-p from the row's own generator, seeded from the request's seed and the choice
   index, so a seeded request gives the same answer at every call (float rounding of a differently
   padded batch may rarely move a sampled token; greedy is the exact path). A greedy row runs draft tokens
   with its next one (pipeline/llm/prompt_lookup.py: guesses from its prompt and answer, as many as pay for
   the step, `step_width`) and keeps them as far as it would have chosen them itself; the columns of the
   rest are masked, like padding;
3. ends rows at an end token (unless `ignore_eos`), a stop string (cut before it), the token budget,
   a loop (`stop_on_repetition`, pipeline/llm/repetition.py: what the row would write next is more of
   the same), or cancellation (the client went away), and drops them from the batch and its cache (in
   place: the rows past the batch's new end move into the slots of those that left, and nothing else is
   copied; bench/rows_leaving.py).
Each step reports to each streaming row's listener (called on the decoding thread): the text so far
that can be shown (a possible start of a stop string and an incomplete UTF-8 character held back),
the new token's log-probabilities when asked, and the finish reason at the end; a row that is not
streamed is reported once, when it finishes (its log-probabilities collected in `Row.logprobs`), since
every report wakes the server's event loop and costs the decoder the GIL.

Why not `transformers serve --continuous-batching`: measured against this server on the same model
(README, "Serving"), and it cannot honour per-request seeds, n, stop strings, penalties and the
world model's structured requests and context checks.
"""

import hashlib
import inspect
import math
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.llm.prompt_lookup import PromptLookup


# A temperature below this samples greedily, as vLLM's does (its _SAMPLING_EPS): logits divided by 1e-40 overflow
# float32 to inf, and the NaN probabilities that follow failed every row decoded beside the one that asked.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    stop_on_repetition: int | None = None  # the loop window in tokens; None: never ended for a loop


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Step:
    text: str  # what can be shown so far (or, with `finish_reason`, the final text)
    logprob: TokenLogprob | None
    finish_reason: str | None  # "stop", "length", "cancelled", "error"
    completion_tokens: int
    error: str | None = None


def row_seed(seed: int | None, choice: int) -> int:
    """A 64-bit generator seed from a request's seed (any integer, 2**63 and past included) and the choice
    index; a fresh random one without a seed."""
    if seed is None:
        return int.from_bytes(os.urandom(8), "little")
    digest = hashlib.blake2b(f"{seed}\x1f{choice}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(eq=False)
class Row:
    prompt: list[int]
    sampling: Sampling
    choice: int
    listener: Callable[[Step], None]
    streaming: bool = False  # report every token; otherwise only the finish (each report wakes the server's loop)
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    cancelled: bool = False
    generator: Any = None
    lookup: "PromptLookup | None" = None  # over prompt and answer, for a greedy row's draft tokens

    @property
    def greedy(self) -> bool:
        return self.sampling.temperature < GREEDY_BELOW

    def cancel(self) -> None:
        self.cancelled = True


# The fewest tokens prompts must have in common beyond what is already shared for their common part to run
# once: below it, a separate one-row pass costs more in overhead than it saves.
MIN_SHARED_PREFIX = 32

# Draft tokens a greedy row may run in a step beside its next one (pipeline/llm/prompt_lookup.py).
DRAFT_TOKENS = 4


class Scheduler:
    def __init__(
        self,
        model,
        tokenizer,
        stop_token_ids: list[int],
        max_batch: int,
        min_shared_prefix: int | None = MIN_SHARED_PREFIX,
        draft_tokens: int = DRAFT_TOKENS,
        kv_cache_gib: float | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.stop_token_ids = set(stop_token_ids)
        self.max_batch = max_batch
        self.min_shared_prefix = (
            min_shared_prefix  # None: every prompt prefilled whole (bench/prefix_sharing.py's baseline)
        )
        self.draft_tokens = draft_tokens  # 0: one token a row a step, no prompt lookup
        # The KV cache's budget in cached tokens of this model (`kv_cache_gib`; None: a quarter of the machine's
        # memory on a CPU, none on an accelerator, where `max_batch` alone limits the rows).
        budget = kv_cache_gib if kv_cache_gib is not None else default_kv_cache_gib(model.device.type)
        per_token = kv_bytes_per_token(model)
        self.kv_cache_tokens = None if budget is None or per_token is None else int(budget * (1 << 30)) // per_token
        self.drafted = self.accepted = 0  # draft tokens run and kept (greedy rows)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._waiting: deque[Row] = deque()
        self._wake = threading.Condition()
        self.running = 0
        self.largest_batch = 0
        self.cancelled = 0
        self.prefilled_tokens = 0  # prompt tokens run through the model (a shared prompt counts once)
        from pipeline.llm.kv_cache import cache_keyword

        accepted = set(inspect.signature(model.forward).parameters)
        self._cache_keyword = cache_keyword(model)
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in accepted else {}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="simulacra-decoder", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Ends the decoding thread once the rows in flight and waiting are done (the backend closes its
        scheduler with its connection; the server's lives as long as the process)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, rows: list[Row]) -> None:
        with self._wake:
            self._waiting.extend(rows)
            self._wake.notify()

    # -- the decoding thread ------------------------------------------------------------------
    def _loop(self) -> None:
        import torch

        batch: _Batch | None = None
        while True:
            with self._wake:
                while batch is None and not self._waiting:
                    if self._closed:
                        return
                    self._wake.wait()
                admitted = self._admitted(batch.rows if batch else [])
            try:
                with torch.inference_mode():
                    admitted = [row for row in admitted if not self._finish_cancelled(row)]
                    if admitted:
                        joining = self._prefill(admitted)
                        batch = joining if batch is None else _stacked([batch, joining])
                    if batch is not None:
                        batch = self._step(batch)
            except Exception as exc:  # out of memory and the like: every row in flight fails, the server lives
                message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                for row in (batch.rows if batch else []) + admitted:
                    row.listener(Step("", None, "error", len(row.generated), message))
                batch = None
            self.running = batch.size if batch else 0
            if batch:
                self.largest_batch = max(self.largest_batch, batch.size)

    def _admitted(self, running: list[Row]) -> list[Row]:
        """Waiting rows that join the batch, in order: up to `max_batch` rows, while the batch's rows times its widest
        row (prompt and answer budget: every row's cache is as wide as the widest's) fit the KV cache's budget; a row
        alone runs whatever its width. Long prompts otherwise filled the batch with rows padded to the longest (a
        benchmark's whole histories: 19 rows of tau-bench, 13 GB on a 24 GB machine)."""
        admitted: list[Row] = []
        rows = len(running)
        widest = max((_extent(row) for row in running), default=0)
        while self._waiting and rows < self.max_batch:
            width = max(widest, _extent(self._waiting[0]))
            if rows and self.kv_cache_tokens is not None and (rows + 1) * width > self.kv_cache_tokens:
                break
            admitted.append(self._waiting.popleft())
            rows, widest = rows + 1, width
        return admitted

    def _finish_cancelled(self, row: Row) -> bool:
        if row.cancelled:
            self.cancelled += 1
            row.listener(Step("", None, "cancelled", 0))
        return row.cancelled

    def _prefill(self, rows: list[Row]) -> "_Batch":
        """The admitted rows' prompts through the model, joined into one batch. Prompts that begin alike
        (`prefix_families`: the system prompt of one environment, the history of one trajectory) run their
        common beginning once; the rest of each runs in groups of similar length (`length_groups`)."""
        by_prompt: dict[tuple[int, ...], list[Row]] = {}
        for row in rows:
            by_prompt.setdefault(tuple(row.prompt), []).append(row)
        return _stacked(self._prefill_after(list(by_prompt), by_prompt, None, 0))

    def _prefill_after(
        self, prompts: list[tuple[int, ...]], by_prompt: dict[tuple[int, ...], list[Row]], cache, done: int
    ) -> list["_Batch"]:
        """Rows whose prompts all begin with the same `done` tokens, whose keys and values `cache` holds (one
        row; None when `done` is 0): each family among them that shares more runs its common part once, on a
        copy of `cache`, and recurses; the rest run their remaining tokens together after `cache`."""
        parts, alone = [], []
        for family in prefix_families(prompts, done, self.min_shared_prefix):
            if len(family) == 1:
                alone += family
                continue
            shared = common_prefix_length(family)
            extended = self._extend(cache, family[0][done:shared], done)
            parts += self._prefill_after(family, by_prompt, extended, shared)
        for group in length_groups([len(prompt) - done for prompt in alone]):
            parts.append(self._prefill_together([row for i in group for row in by_prompt[alone[i]]], cache, done))
        return parts

    def _extend(self, cache, tokens: tuple[int, ...], done: int):
        """A new one-row cache: `cache`'s `done` tokens (copied) and then `tokens`."""
        import torch

        device = self.model.device
        extended = _copied(cache, 1)
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        mask = torch.ones((1, done + len(tokens)), dtype=torch.long, device=device)
        positions = torch.arange(done, done + len(tokens), device=device).unsqueeze(0)
        self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_keyword: extended},
            **self._last_logits_only,
        )
        self.prefilled_tokens += len(tokens)
        return extended

    def _prefill_together(self, rows: list[Row], cache=None, done: int = 0) -> "_Batch":
        """The rows' prompts through the model at once, after the `done` tokens they share in `cache` (one
        row, copied to each), each left-padded to the longest: padding sits between the shared part and a
        row's own, masked, and positions count a row's own tokens only. Rows with the same prompt (the
        choices of one request, or the K samples of one SFT query) share one prefill: the prompt runs once
        and its cache and next-token logits are copied to each of them."""
        import torch

        device = self.model.device
        prompts: dict[tuple[int, ...], int] = {}
        of_row = [prompts.setdefault(tuple(row.prompt), len(prompts)) for row in rows]
        unique = [prompt[done:] for prompt in prompts]
        width = max(map(len, unique))
        ids = torch.full((len(unique), width), self.pad_id, dtype=torch.long, device=device)
        own = torch.zeros((len(unique), width), dtype=torch.long, device=device)
        for i, prompt in enumerate(unique):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, device=device)
            own[i, width - len(prompt) :] = 1
        for row in rows:
            row.generator = torch.Generator(device=device).manual_seed(row_seed(row.sampling.seed, row.choice))
        positions = (done + own.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([torch.ones((len(unique), done), dtype=torch.long, device=device), own], dim=1)
        # A copy per row: each grows its own answer from here (no copy of the whole cache per token either,
        # pipeline/llm/kv_cache.py).
        cache = _copied(cache, len(unique))
        # Only the last position's logits: the head over a whole prompt is a fifth of a small model's
        # prefill and a [rows, prompt, vocab] tensor.
        logits = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_keyword: cache},
            **self._last_logits_only,
        ).logits[:, -1, :]
        if len(unique) < len(rows):
            index = torch.tensor(of_row, device=device)
            cache.batch_select_indices(index)
            mask, positions, logits = mask[index], positions[index], logits[index]
        self.prefilled_tokens += sum(map(len, unique))
        return _Batch(rows, cache, mask, positions[:, -1], logits.float())

    def _step(self, batch: "_Batch") -> "_Batch | None":
        import torch

        keep = []
        for i, row in enumerate(batch.rows):
            if row.cancelled:
                self.cancelled += 1
                row.listener(Step(self._text(row), None, "cancelled", len(row.generated)))
                continue
            if self._take(row, *self._choose(batch.logits[i], row)):
                keep.append(i)
        if not keep:
            return None
        batch = batch.select(keep)  # the rows that stay, perhaps in a new order
        drafts = self._drafts(batch.rows)
        width = 1 + max(map(len, drafts))
        device = self.model.device
        step_ids = torch.full((batch.size, width), self.pad_id, dtype=torch.long, device=device)
        fed = torch.zeros((batch.size, width), dtype=batch.mask.dtype, device=device)
        for i, (row, draft) in enumerate(zip(batch.rows, drafts)):
            step_ids[i, : 1 + len(draft)] = torch.tensor([row.generated[-1], *draft], device=device)
            fed[i, : 1 + len(draft)] = 1
        batch.mask = torch.cat([batch.mask, fed], dim=1)
        positions = batch.last_position.unsqueeze(1) + 1 + torch.arange(width, device=device)
        logits = self.model(
            input_ids=step_ids,
            attention_mask=batch.mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_keyword: batch.cache},
        ).logits.float()
        if width == 1:
            batch.logits = logits[:, -1, :]
            batch.last_position = batch.last_position + 1
            return batch
        return self._verified(batch, drafts, logits)

    def _drafts(self, rows: list[Row]) -> list[list[int]]:
        """Each row's draft tokens (pipeline/llm/prompt_lookup.py): greedy rows only, a sampled token cannot be
        checked against a guess without changing its distribution. How many a step runs (`step_width`) follows the
        rows' record of kept drafts and the batch's size: with many rows a step is bound by its tokens' arithmetic,
        and guesses that miss cost it; with few it is bound by reading the weights, and guesses come nearly free."""
        from pipeline.llm.prompt_lookup import PromptLookup, step_width

        drafts: list[list[int]] = []
        acceptance: list[float] = []
        for row in rows:
            if self.draft_tokens <= 0 or not row.greedy:
                drafts.append([])
                acceptance.append(0.0)
                continue
            if row.lookup is None:
                row.lookup = PromptLookup(row.prompt)
            row.lookup.extend(row.generated[len(row.lookup.tokens) - len(row.prompt) :])
            drafts.append(row.lookup.draft(self.draft_tokens))
            acceptance.append(row.lookup.acceptance)
        width = step_width(drafts, acceptance)
        if width == 1:
            for row, draft in zip(rows, drafts):
                if row.lookup is not None:
                    row.lookup.proposed = draft
        return [draft[: width - 1] for draft in drafts]

    def _verified(self, batch: "_Batch", drafts: list[list[int]], logits) -> "_Batch | None":
        """After a step that ran draft tokens: each row keeps its drafts up to the first the model would not
        have chosen (each chosen from the logits after the one before, as if decoded one at a time), the
        columns of the rest are masked, and its next token's logits are those after its last kept token."""
        import torch

        width = logits.shape[1]
        keep, kept_drafts = [], []
        for i, (row, draft) in enumerate(zip(batch.rows, drafts)):
            kept, going, cut = 0, True, False
            while kept < len(draft):
                token, logprob = self._choose(logits[i, kept], row)
                if token != draft[kept]:
                    cut = True
                    break
                kept += 1
                going = self._take(row, token, logprob)
                if not going:
                    break
            if draft and row.lookup is not None:  # a row with a draft has its lookup
                row.lookup.record(len(draft), kept, cut)
            batch.mask[i, batch.mask.shape[1] - width + 1 + kept :] = 0
            self.drafted += len(draft)
            self.accepted += kept
            kept_drafts.append(kept)
            if going:
                keep.append(i)
        advanced = torch.tensor(kept_drafts, device=logits.device)
        batch.last_position = batch.last_position + 1 + advanced
        batch.logits = logits[torch.arange(len(drafts), device=logits.device), advanced]
        return batch.select(keep) if keep else None

    def _take(self, row: Row, token: int, logprob: "TokenLogprob | None") -> bool:
        """`token` appended to the row's answer, the row told when it streams or finishes; whether it goes on."""
        row.generated.append(token)
        if logprob is not None:
            row.logprobs.append(logprob)
        finish, text = self._finished(row, token)
        if row.streaming or finish is not None:
            row.listener(Step(text, logprob, finish, len(row.generated)))
        return finish is None

    def _choose(self, logits, row: Row) -> tuple[int, TokenLogprob | None]:
        import torch

        s = row.sampling
        raw = logits
        adjusted = logits.clone()
        for token, bias in s.logit_bias:
            if 0 <= token < adjusted.shape[0]:
                adjusted[token] += bias
        if (s.presence_penalty or s.frequency_penalty) and row.generated:
            seen, counts = torch.unique(torch.tensor(row.generated, device=adjusted.device), return_counts=True)
            adjusted[seen] -= s.presence_penalty + s.frequency_penalty * counts.to(adjusted.dtype)
        if row.greedy:
            token = int(adjusted.argmax())
        else:
            probs = torch.softmax(adjusted / s.temperature, dim=-1)
            if s.top_p < 1.0:
                ordered, order = probs.sort(descending=True)
                outside = ordered.cumsum(-1) - ordered > s.top_p  # keep the smallest set whose mass reaches top_p
                ordered[outside] = 0
                probs = torch.zeros_like(probs).scatter(0, order, ordered)
            token = int(torch.multinomial(probs, 1, generator=row.generator))
        if not s.logprobs:
            return token, None
        # The model's own distribution, before sampling adjustments (vLLM's default too).
        logprobs = torch.log_softmax(raw, dim=-1)
        top: tuple[tuple[int, float], ...] = ()
        if s.top_logprobs:
            values, indices = logprobs.topk(s.top_logprobs)
            top = tuple((int(i), _finite(float(v))) for i, v in zip(indices, values))
        return token, TokenLogprob(token, _finite(float(logprobs[token])), top)

    def _text(self, row: Row) -> str:
        ids = [t for t in row.generated if t not in self.stop_token_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _finished(self, row: Row, token: int) -> tuple[str | None, str]:
        """(finish reason or None, the text to show): the whole text at the end, else the part no stop
        string or incomplete character can still change."""
        s = row.sampling
        if token in self.stop_token_ids and not s.ignore_eos:
            return "stop", self._text(row)
        text = self._text(row)
        for stop in s.stop:
            at = text.find(stop)
            if at >= 0:
                return "stop", text[:at]
        if len(row.generated) >= s.max_tokens:
            return "length", text
        if s.stop_on_repetition is not None:
            from pipeline.llm.repetition import repeating  # imports transformers: not at the server's start

            if repeating(row.generated, s.stop_on_repetition):
                return "stop", text
        held = max((len(stop) - 1 for stop in s.stop), default=0)
        shown = text[: len(text) - held] if held else text
        return None, shown.rstrip("\ufffd")


# Padding a prefill may add, as a share of the prompt tokens it runs: prompts from 300 to 1,600 tokens
# (the demo's) prefilled in one left-padded batch would run about twice their tokens.
PREFILL_PADDING = 0.25


def length_groups(lengths: list[int]) -> list[list[int]]:
    """Indices of `lengths` in groups prefilled together: by length, a group growing while its padded size
    (rows x longest) stays within `PREFILL_PADDING` of its tokens. On a CPU a prefill is bound by its
    tokens (a 600-token prompt alone runs as fast per token as 8 together), so padding is pure loss."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    tokens = 0
    for i in order:
        group = groups[-1] if groups else None
        if group is not None and (len(group) + 1) * lengths[i] <= (1 + PREFILL_PADDING) * (tokens + lengths[i]):
            group.append(i)
            tokens += lengths[i]
        else:
            groups.append([i])
            tokens = lengths[i]
    return groups


def prefix_families(prompts: list[tuple[int, ...]], done: int, min_shared: int | None) -> list[list[tuple[int, ...]]]:
    """`prompts` (distinct, all beginning with the same `done` tokens) in families whose members have at least
    `min_shared` more tokens in common, with a token of each left over; a prompt that shares too little with
    every other is a family of one. In sorted order, a set's common beginning is the shortest between
    neighbours, so one pass over the sorted prompts finds the families."""
    ordered = sorted(prompts)
    if min_shared is None:
        return [[prompt] for prompt in ordered]
    families: list[list[tuple[int, ...]]] = []
    shortest = 0
    for prompt in ordered:
        family = families[-1] if families else None
        if (
            family is not None
            and min(_begin_alike(family[0], prompt), min(shortest, len(prompt)) - 1) >= done + min_shared
        ):
            family.append(prompt)
            shortest = min(shortest, len(prompt))
        else:
            families.append([prompt])
            shortest = len(prompt)
    return families


def common_prefix_length(prompts: list[tuple[int, ...]]) -> int:
    """Tokens every prompt begins with, leaving each at least one of its own (its last position's logits
    come from running it). The sorted extremes begin alike no further than any pair does."""
    return min(_begin_alike(min(prompts), max(prompts)), min(map(len, prompts)) - 1)


def _begin_alike(first: tuple[int, ...], second: tuple[int, ...]) -> int:
    length = 0
    for a, b in zip(first, second):
        if a != b:
            break
        length += 1
    return length


def _extent(row: Row) -> int:
    """The most positions a row can take in the cache: its prompt and its answer budget."""
    return len(row.prompt) + row.sampling.max_tokens


def kv_bytes_per_token(model) -> int | None:
    """Bytes one cached token takes across the model's layers: its keys and values. None for a config that does not
    say (no budget then, rather than a guess)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    try:
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return 2 * config.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize
    except (AttributeError, TypeError):
        return None


def default_kv_cache_gib(device_type: str) -> float | None:
    """A quarter of the machine's memory on a CPU (the cache's buffers reserve half as much again to grow into,
    and the model, its activations and the rest of the process share the rest); None on an accelerator, whose
    rows `max_batch` limits."""
    if device_type != "cpu":
        return None
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 4 / (1 << 30)


def _copied(cache, rows: int):
    """A new cache holding `cache`'s one row `rows` times (an empty one for None)."""
    from pipeline.llm.kv_cache import ReservedCache

    copy = ReservedCache()
    for layer_index, layer in enumerate(cache.layers if cache is not None else ()):
        copy.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), layer_index)
    return copy


def _finite(value: float) -> float:
    """-inf (a token of probability 0) as JSON can carry it: OpenAI's floor of -9999."""
    return value if math.isfinite(value) else -9999.0


@dataclass
class _Batch:
    rows: list[Row]
    cache: Any  # ReservedCache
    mask: Any  # [rows, columns] 1 where a token is
    last_position: Any  # [rows] position of each row's last token
    logits: Any  # [rows, vocab] of each row's next token

    @property
    def size(self) -> int:
        return len(self.rows)

    def select(self, keep: list[int]) -> "_Batch":
        import torch

        from pipeline.llm.kv_cache import compacted_order

        if len(keep) < len(self.rows):
            # In place: only the rows past the new end move, into the slots of rows that left (their order
            # changes; each row's identity travels with it).
            order = compacted_order(keep, len(self.rows))
            for layer in self.cache.layers:
                layer.keep_rows(order)
            index = torch.tensor(order, device=self.mask.device)
            self.rows = [self.rows[i] for i in order]
            self.mask, self.last_position, self.logits = self.mask[index], self.last_position[index], self.logits[index]
            self._trim()
        return self

    def _trim(self) -> None:
        """Drop leading columns no row attends to any more (the padding of rows that left)."""
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.drop_leading(start)  # a view: the room past the end stays


def _stacked(parts: list[_Batch]) -> _Batch:
    """Batches as one, in order, each padded on the left to the widest cache (a row's padding is masked; its
    keys and values are zeros, since a masked column's weight is 0 and 0 x NaN is not). Every part's cache is
    copied once, into buffers with room for the tokens to come: joined two at a time, a prefill of the demo's
    24 validation targets (dozens of parts: prefix families and length groups) copied the growing batch once
    per part, a third of its time, and the first decoding step copied it all again to make room."""
    import torch

    from pipeline.llm.kv_cache import ReservedCache, ReservedLayer, reserved_length

    if len(parts) == 1:
        return parts[0]
    width = max(part.mask.shape[1] for part in parts)
    rows = sum(part.size for part in parts)
    cache = ReservedCache()
    for layers in zip(*(part.cache.layers for part in parts)):
        buffers = []
        for name in ("keys", "values"):
            first = getattr(layers[0], name)
            buffer = first.new_empty((rows, first.shape[1], reserved_length(width), first.shape[3]))
            at = 0
            for layer in layers:
                states = getattr(layer, name)
                count, length = states.shape[0], states.shape[-2]
                buffer[at : at + count, :, : width - length] = 0
                buffer[at : at + count, :, width - length : width] = states
                at += count
            buffers.append(buffer)
        stacked = ReservedLayer()
        keys, values = buffers
        stacked.adopt(keys, values, width)
        cache.layers.append(stacked)
    mask = torch.zeros((rows, width), dtype=parts[0].mask.dtype, device=parts[0].mask.device)
    at = 0
    for part in parts:
        mask[at : at + part.size, width - part.mask.shape[1] :] = part.mask
        at += part.size
    return _Batch(
        [row for part in parts for row in part.rows],
        cache,
        mask,
        torch.cat([part.last_position for part in parts]),
        torch.cat([part.logits for part in parts]),
    )
