"""Draft tokens by prompt lookup (pipeline/llm/prompt_lookup.py), checked in one forward pass by the continuous
batch (pipeline/llm/batching.py), and the grouped-query attention those multi-token steps run on
(pipeline/llm/packed_attention.py): the same greedy answers as one token a step, in fewer steps."""

import random
import threading

import pytest
import torch

from pipeline.llm.prompt_lookup import PromptLookup


def test_a_draft_is_what_followed_the_latest_occurrence_of_the_longest_matching_ending():
    lookup = PromptLookup([1, 2, 3, 9, 8, 2, 3, 7, 6, 5, 4, 2, 3])
    # "2 3" occurred at 1 and at 5: the later one is followed by 7 6 5.
    assert lookup.draft(3) == [7, 6, 5]
    lookup.extend([1, 2, 3])
    # "1 2 3" (three tokens) beats the later "2 3": what followed it was 9 8.
    assert lookup.draft(2) == [9, 8]
    assert lookup.draft(0) == []


def test_no_draft_when_the_last_token_never_occurred_before():
    assert PromptLookup([1, 2, 3, 4]).draft(4) == []
    assert PromptLookup([]).draft(4) == []


def test_a_loop_drafts_its_own_continuation_round_and_round():
    assert PromptLookup([5, 6, 5, 6, 5]).draft(5) == [6, 5, 6, 5, 6]  # "5 6 5" two tokens back: period 2
    assert PromptLookup([9, 3, 3]).draft(4) == [3, 3, 3, 3]  # a one-token loop
    assert PromptLookup([1, 2, 3, 4, 1, 2]).draft(3) == [3, 4, 1]  # what followed, then round again


def test_growing_a_row_indexes_as_building_it_whole():
    rng = random.Random(1)
    tokens = [rng.randrange(6) for _ in range(200)]
    grown = PromptLookup(tokens[:50])
    for start in range(50, 200, 7):
        grown.extend(tokens[start : start + 7])
        whole = PromptLookup(tokens[: start + 7])
        assert grown.draft(5) == whole.draft(5)


@pytest.fixture(scope="module")
def tiny_lm(tiny_chat_model):
    from pipeline.training.models import load_causal_lm, load_tokenizer

    return load_causal_lm(str(tiny_chat_model)).eval(), load_tokenizer(str(tiny_chat_model))


def _decode(model, tokenizer, prompts, sampling, draft_tokens: int):
    from pipeline.llm.batching import Row, Scheduler

    scheduler = Scheduler(model, tokenizer, [tokenizer.eos_token_id], max_batch=len(prompts), draft_tokens=draft_tokens)
    done, ended = threading.Event(), {}

    def listener(index):
        def report(step) -> None:
            if step.finish_reason is not None:
                ended[index] = step
                if len(ended) == len(prompts):
                    done.set()

        return report

    rows = [Row(prompt, sampling, 0, listener(i), sampling.logprobs) for i, prompt in enumerate(prompts)]
    scheduler.submit(rows)
    assert done.wait(120)
    scheduler.close()
    return rows, [ended[i] for i in range(len(prompts))], scheduler


def _prompts(tokenizer):
    # Repetitive prompts of different lengths: a random tiny model copies and loops, so drafts hit and miss.
    texts = ["ls notes ls notes ls notes ls", "cat file error json value cat file error", "true", "grep root grep root"]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def test_greedy_answers_with_drafts_are_those_decoded_a_token_at_a_time(tiny_lm):
    from pipeline.llm.batching import Sampling

    model, tokenizer = tiny_lm
    # A random tiny model repeats one token; a presence penalty moves it off its loops now and then, so some
    # drafts are refused, and the penalty is applied token by token along an accepted draft.
    sampling = Sampling(
        max_tokens=40, temperature=0, presence_penalty=0.5, logprobs=True, top_logprobs=2, ignore_eos=True
    )
    plain, plain_ends, _ = _decode(model, tokenizer, _prompts(tokenizer), sampling, draft_tokens=0)
    drafted, drafted_ends, scheduler = _decode(model, tokenizer, _prompts(tokenizer), sampling, draft_tokens=4)
    assert scheduler.accepted > 0 and scheduler.drafted > scheduler.accepted  # drafts kept and drafts refused
    assert [row.generated for row in drafted] == [row.generated for row in plain]
    assert all(len(row.generated) == 40 for row in drafted)  # the budget holds when a draft runs past it
    assert [end.text for end in drafted_ends] == [end.text for end in plain_ends]
    for with_drafts, without in zip(drafted, plain):
        assert [p.token_id for p in with_drafts.logprobs] == [p.token_id for p in without.logprobs]
        assert [p.logprob for p in with_drafts.logprobs] == pytest.approx(
            [p.logprob for p in without.logprobs], abs=1e-4
        )


def test_a_stop_string_inside_accepted_drafts_ends_the_answer_before_it(tiny_lm):
    from pipeline.llm.batching import Sampling

    model, tokenizer = tiny_lm
    plain, _, _ = _decode(model, tokenizer, _prompts(tokenizer), Sampling(max_tokens=40, temperature=0), 0)
    # A stop string taken from the middle of each plain answer: the drafted run ends where the plain one does.
    texts = [tokenizer.decode(row.generated[10:13]) for row in plain]
    for prompt, stop in zip(_prompts(tokenizer), texts):
        sampling = Sampling(max_tokens=40, temperature=0, stop=(stop,))
        _, (first,), _ = _decode(model, tokenizer, [prompt], sampling, 0)
        _, (second,), _ = _decode(model, tokenizer, [prompt], sampling, 4)
        assert second.text == first.text and second.completion_tokens == first.completion_tokens


def test_sampled_rows_never_draft(tiny_lm):
    from pipeline.llm.batching import Sampling

    model, tokenizer = tiny_lm
    _, _, scheduler = _decode(model, tokenizer, _prompts(tokenizer), Sampling(max_tokens=20, seed=3), 4)
    assert scheduler.drafted == 0


def test_a_step_runs_long_drafts_for_few_rows_or_loops_and_none_for_a_full_batch_writing_anew():
    from pipeline.llm.prompt_lookup import step_width

    four = [[1, 2, 3, 4]]
    assert step_width(four * 4, [0.5] * 4) == 2  # few rows, even odds: one guess each
    assert step_width(four * 4, [0.95] * 4) == 5  # few rows in a loop: all four
    assert step_width(four * 24, [0.95] * 24) == 5  # a full batch in a loop: all four still pay
    assert step_width(four * 24, [0.3] * 24) == 1  # a full batch writing anew: one token a step
    assert step_width([[], [], [9]], [0.0, 0.0, 0.99]) == 2  # as far as the longest draft goes
    assert step_width([[]] * 3, [0.5] * 3) == 1


def test_a_row_keeps_its_record_of_kept_and_refused_drafts():
    lookup = PromptLookup([1, 2, 3])
    assert lookup.acceptance == 0.5
    lookup.record(4, 4, cut=False)  # all kept
    lookup.record(4, 1, cut=True)  # the second refused
    lookup.record(3, 2, cut=False)  # the row finished on the second
    assert (lookup.kept, lookup.refused) == (7, 1)
    assert lookup.acceptance == 8 / 10


def test_a_guess_not_run_is_checked_against_the_token_written():
    lookup = PromptLookup([1, 2, 3, 1, 2])
    lookup.proposed = [3, 1]
    lookup.extend([3])  # the row wrote what was guessed
    assert (lookup.kept, lookup.refused) == (1, 0)
    lookup.proposed = [1, 2]
    lookup.extend([7])
    assert (lookup.kept, lookup.refused, lookup.proposed) == (1, 1, [])
    lookup.extend([8])  # nothing proposed: nothing recorded
    assert (lookup.kept, lookup.refused) == (1, 1)


def test_a_full_batch_in_a_loop_comes_to_run_its_drafts(tiny_lm):
    """24 rows of a random tiny model (each repeats one token) start at even odds, where a full batch runs one
    token a step; the guesses not run are checked against what the rows write, and the batch then runs them."""
    from pipeline.llm.batching import Sampling

    model, tokenizer = tiny_lm
    prompts = [tokenizer.encode(f"ls notes {i} cat", add_special_tokens=False) for i in range(24)]
    _, _, scheduler = _decode(model, tokenizer, prompts, Sampling(max_tokens=30, temperature=0, ignore_eos=True), 4)
    assert scheduler.accepted > 24 * 10


def _grouped_query_model():
    """A random Llama-shaped model with 4 query heads over 2 key/value heads (the tiny model has no grouping)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def test_packed_attention_computes_sdpa_for_padded_multi_token_steps():
    from pipeline.llm.kv_cache import ReservedCache
    from pipeline.llm.packed_attention import NAME, use_packed_attention

    model = _grouped_query_model()
    ids = torch.randint(0, 64, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    mask[1, 7] = 0  # a column in the middle, as a refused draft leaves one
    step = torch.randint(0, 64, (3, 4))
    step_mask = torch.cat([mask, torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])], dim=1)

    def logits():
        with torch.inference_mode():
            cache = ReservedCache()
            model(input_ids=ids, attention_mask=mask, use_cache=True, past_key_values=cache)
            positions = (mask.sum(-1, keepdim=True) - 1) + 1 + torch.arange(4)
            return model(
                input_ids=step, attention_mask=step_mask, position_ids=positions, use_cache=True, past_key_values=cache
            ).logits

    expected = logits()
    assert use_packed_attention(model) is model and model.config._attn_implementation == NAME
    packed = logits()
    real = step_mask[:, -4:].bool()
    assert torch.allclose(packed[real], expected[real], atol=1e-5)


def test_packed_attention_leaves_other_attention_alone():
    from pipeline.llm.packed_attention import use_packed_attention

    model = _grouped_query_model()
    model.set_attn_implementation("eager")
    assert use_packed_attention(model).config._attn_implementation == "eager"
