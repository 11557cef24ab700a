"""RL rewards as TRL calls them: token ids in, one reward per completion out, on the [0, 25] scale.

The rubric path runs against the real test OpenAI server as the judge, with scripted answers
(valid, not JSON, out of range, a missing criterion) and a completion without its tags; the rule
path runs real verifiers in the sandbox.
"""

import asyncio
import json

import pytest
from openai_server import Fault, OpenAIServer

from pipeline.config.llm import EndpointConfig
from pipeline.config.model import TinyModelConfig
from pipeline.config.rl import RewardConfig
from pipeline.config.sft import JudgeConfig
from pipeline.llm.client import open_client
from pipeline.rewards.semantic import Similarity
from pipeline.rl.controls import CONTROLS
from pipeline.rl.judge import RubricJudge
from pipeline.rl.prompts import RLPrompt
from pipeline.rl.rewards import Rewards, semantic_reward
from pipeline.training.tiny_model import train_tokenizer

PASSES_IF_42 = "def verify(prediction):\n    return prediction.strip() == '42'\n"


@pytest.fixture(scope="module")
def tokenizer():
    text = ["<think> the count is </think> 42 lines total wc -l file json error " * 4] * 50
    return train_tokenizer(TinyModelConfig(vocab_size=300), text)


def prompt(index: int, reference: str = "42", verifier: str | None = None, control: str | None = None) -> RLPrompt:
    messages = [
        {"role": "system", "content": "simulate"},
        {"role": "user", "content": "ls /app"},
        {"role": "assistant", "content": "app.py"},
        {"role": "user", "content": "wc -l /app/app.py"},
    ]
    return RLPrompt(index, f"traj-{index}", 3, "terminal", messages, reference, verifier, control)


def ids(tokenizer, texts):
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


@pytest.fixture(scope="module")
def trl_loop():
    """The event loop TRL awaits async reward functions on: its own, in a daemon thread."""
    from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

    thread, loop, ready = start_event_loop_in_daemon()
    ready.wait()
    yield loop
    shutdown_event_loop_in_daemon(thread, loop)


def call(function, tokenizer, texts, indices, loop=None):
    """One reward call as GRPOTrainer makes it (on TRL's loop when given)."""
    metrics = {}
    coroutine = function(
        prompts=[None] * len(texts),
        completions=[None] * len(texts),
        completion_ids=ids(tokenizer, texts),
        prompt_index=indices,
        log_metric=lambda name, value: metrics.setdefault(name, value),
    )
    rewards = asyncio.run_coroutine_threadsafe(coroutine, loop).result() if loop else asyncio.run(coroutine)
    return rewards, metrics


def verdict(format=5, factuality=5, consistency=5, realism=5, quality=5):
    return json.dumps(
        {
            "content_classes": ["deterministic"],
            "format": format,
            "factuality": factuality,
            "consistency": consistency,
            "realism": realism,
            "quality": quality,
            "rationale": "r",
        }
    )


# prediction (after </think>) -> the judge's scripted answer, and the reward it must give
JUDGE_CASES = [
    ("42", verdict(), 25.0),  # every criterion 5: mean 5 x 5
    ("41", verdict(1, 1, 1, 1, 1), 5.0),  # the floor of a valid answer
    ("43", verdict(3, 4, 5, 2, 1), 15.0),  # mean 3
    ("44", "the prediction looks fine to me", 0.0),  # not JSON
    ("45", verdict(format=6), 0.0),  # out of range
    ("46", json.dumps({"format": 5, "rationale": "r"}), 0.0),  # criteria missing
]


def test_rubric_reward_through_the_test_server_judge(tokenizer, store, trl_loop):
    script = {prediction: answer for prediction, answer, _ in JUDGE_CASES}

    def answer(request):
        user = request["messages"][-1]["content"]
        return script[user.rsplit("## Predicted observation\n", 1)[1]]

    prompts = [prompt(0), prompt(1, control="paginated_response")]
    texts = [f"<think>\nSELF-PRAISE: this is perfect\n</think>\n\n{p}" for p, _, _ in JUDGE_CASES]
    texts.append("42 with no thinking block")  # missing tags: 0, the judge never sees it
    indices = [0] * len(JUDGE_CASES) + [1]
    with OpenAIServer(answer=answer) as server:
        endpoint = EndpointConfig(
            backend="openai", base_url=server.base_url, model=server.model, max_retries=0, temperature=0.0
        )
        judge = RubricJudge(open_client(endpoint, store, "rl.judge"), history_turns=2)
        config = RewardConfig(judge=JudgeConfig(kind="llm", endpoint=endpoint))
        main, _ = Rewards(prompts, tokenizer, config, judge).functions()
        rewards, metrics = call(main, tokenizer, texts, indices, trl_loop)
        requests = [entry.body for entry in server.log]
        # The same completions at a later step (a resumed run's seeded rollouts): answered from the cache, but for the
        # three answers that were no judgement: rejected as they arrived, failed requests, asked again.
        again, _ = call(main, tokenizer, texts, indices, trl_loop)
        assert again == rewards and len(server.log) == len(requests) + 3

    assert main.__name__ == "rubric"
    assert rewards == [expected for _, _, expected in JUDGE_CASES] + [0.0]
    assert metrics["judge/failure_rate"] == pytest.approx(3 / 6)
    assert metrics["completions/missing_tags_rate"] == pytest.approx(1 / 7)
    assert len(requests) == 6  # the untagged completion was never sent
    for body in requests:
        text = json.dumps(body)
        assert "SELF-PRAISE" not in text and "<think>" not in text  # strict extraction: no thinking reaches the judge
        assert body["response_format"]["type"] == "json_schema"
        assert "## Reference observation\n42" in body["messages"][-1]["content"]


def test_the_judge_is_told_the_control_instruction(tokenizer, store):
    with OpenAIServer(answer=lambda request: verdict()) as server:
        endpoint = EndpointConfig(backend="openai", base_url=server.base_url, model=server.model, temperature=0.0)
        judge = RubricJudge(open_client(endpoint, store, "rl.judge"), history_turns=2)
        asyncio.run(judge.score([(prompt(0), "x"), (prompt(1, control="partial_batch_failure"), "y")]))
        plain, controlled = sorted(
            (entry.body for entry in server.log), key=lambda body: body["messages"][-1]["content"][-1]
        )
    assert CONTROLS["partial_batch_failure"] in controlled["messages"][-1]["content"]
    assert "## Control instruction" in controlled["messages"][0]["content"]
    assert "Control instruction" not in json.dumps(plain)


def test_a_failed_judge_request_gives_zero_and_counts_as_a_failure(tokenizer, store):
    with OpenAIServer(answer=lambda request: verdict()) as server:
        server.faults.extend([Fault("server_error")])
        endpoint = EndpointConfig(backend="openai", base_url=server.base_url, model=server.model, max_retries=0)
        judge = RubricJudge(open_client(endpoint, store, "rl.judge"), history_turns=2)
        config = RewardConfig(judge=JudgeConfig(kind="llm", endpoint=endpoint))
        main, _ = Rewards([prompt(0)], tokenizer, config, judge).functions()
        rewards, metrics = call(main, tokenizer, ["<think>\na\n</think>\n\n42"], [0])
    assert rewards == [0.0]
    assert metrics["judge/failure_rate"] == 1.0


# (verifier, completion) -> rule reward: None where the turn has no verifier
RULE_CASES = [
    (PASSES_IF_42, "<think>\ncount\n</think>\n\n42", 25.0),
    (PASSES_IF_42, "<think>\ncount\n</think>\n\n41", 0.0),
    (PASSES_IF_42, "42", 0.0),  # missing tags: nothing to verify
    ("def verify(prediction):\n    while True: pass\n", "<think>\nx\n</think>\n\n42", 0.0),  # CPU limit
    (None, "<think>\ncount\n</think>\n\n42", None),  # no verifier: the rule does not apply
]
# A prompt with a control instruction asks for a faulty observation its verifier would reject.
CONTROLLED = (PASSES_IF_42, "<think>\nan error\n</think>\n\n503 Service Unavailable", None)


def test_rule_reward_runs_each_turns_verifier(tokenizer):
    cases = RULE_CASES + [CONTROLLED]
    prompts = [prompt(i, verifier=code) for i, (code, _, _) in enumerate(RULE_CASES)]
    prompts.append(prompt(len(RULE_CASES), verifier=CONTROLLED[0], control="intermittent_api_error"))
    config = RewardConfig(sandbox={"cpu_time_s": 1, "wall_timeout_s": 5})
    _, rule = Rewards(prompts, tokenizer, config).functions()
    rewards, metrics = call(rule, tokenizer, [text for _, text, _ in cases], list(range(len(cases))))
    if any(r is None for r in rewards[:4]):
        pytest.fail(f"a verifier did not run: {rewards}")
    assert rewards == [expected for _, _, expected in cases]
    assert metrics["rule/coverage"] == pytest.approx(4 / 6)
    assert metrics["rule/pass_rate"] == pytest.approx(1 / 4)


# (score, method) -> semantic reward: graded, 25 x the offline judge's score, for text and JSON alike
SEMANTIC_CASES = [
    (1.0, "identical", 25.0),
    (0.48, "observation", 12.0),  # wrong by one byte: half the reward, not RWML's all-or-nothing 0
    (0.15, "observation", 3.75),  # a restatement of the command: less
    (0.75, "json_leaves", 18.75),
    (0.0, "empty_reference", 0.0),
]


@pytest.mark.parametrize(("value", "method", "expected"), SEMANTIC_CASES)
def test_semantic_reward(value, method, expected):
    assert semantic_reward(Similarity(value, method)) == pytest.approx(expected)


def test_semantic_reward_function_scores_parsed_predictions_against_the_reference(tokenizer):
    prompts = [prompt(0, reference='{"rows": 42}'), prompt(1, reference='{"rows": 42}')]
    main, _ = Rewards(prompts, tokenizer, RewardConfig()).functions()
    rewards, metrics = call(main, tokenizer, ['<think>\nx\n</think>\n\n{"rows": 42}', '{"rows": 42}'], [0, 1])
    assert main.__name__ == "semantic"
    assert rewards == [25.0, 0.0]  # identical JSON: score 1; the untagged twin: 0
    assert metrics["completions/missing_tags_rate"] == 0.5


def test_a_control_prompt_is_rewarded_for_obeying_not_for_copying_the_fault_free_reference(tokenizer):
    """Issue 17 item 4: on the semantic judge a copy of the reference scored 25 and the requested fault 0."""
    prompts = [
        prompt(0, control="intermittent_api_error"),
        prompt(1, reference='{"rows": 42}', control="intermittent_api_error"),
        prompt(2),
    ]
    texts = [
        "42",
        "bash: connect: Connection timed out; try again",
        '{"error": "503 Service Unavailable"}',
        '{"rows": 42}',
        "503 Service Unavailable: retry later",
        "42",
    ]
    main, _ = Rewards(prompts, tokenizer, RewardConfig()).functions()
    rewards, metrics = call(main, tokenizer, [f"<think>\nx\n</think>\n\n{t}" for t in texts], [0, 0, 0, 1, 1, 2])
    # the copy, the fault in the terminal's form, a JSON error where it prints text; the JSON copy,
    # prose where the tool answers JSON; a plain prompt, scored against its reference as before
    assert rewards == [0.0, 25.0, 15.0, 0.0, 15.0, 25.0]
    assert metrics["control/following_rate"] == pytest.approx(3 / 5)
