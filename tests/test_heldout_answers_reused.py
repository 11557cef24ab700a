"""Answers made in a scratch cache can join the store's cache (pipeline/llm/cache.py `adopt_answers`), and
the training stages' validation asks a model as evaluation does.

- adopted answers are served from the store without loading the model; failures are not adopted;
  adopting twice adds nothing;
- the requests are the same: validation's messages equal evaluation's for each answer format;
- the demo config keeps them alike: the same history and token budget.
"""

from pathlib import Path

from pipeline.config import load_config
from pipeline.config.llm import EndpointConfig
from pipeline.evaluation.prompting import NON_THINKING, RL_THINKING, THINKING, query_messages
from pipeline.llm.cache import adopt_answers
from pipeline.llm.client import ChatRequest, open_client
from pipeline.prompts.rl import rl_messages
from pipeline.sft.queries import Query
from pipeline.store.database import Store
from pipeline.store.schema import ScoredTurn, SystemPrompt

REPO = Path(__file__).resolve().parents[1]
QUERY = Query(
    trajectory_id="t1",
    turn_index=2,
    domain="terminal",
    system=SystemPrompt(
        task_description="A shell in a fresh home folder.",
        action_space="bash commands",
        simulation_instructions="Answer as bash would.",
    ),
    history=(ScoredTurn(0, "mkdir notes", "", "action", 1.0), ScoredTurn(1, "ls", "notes\n", "retrieval", 1.0)),
    action="ls notes",
    reference="",
    history_left_out=0,
)


def test_adopted_answers_are_served_from_the_store_without_loading_the_model(tiny_chat_model, tmp_path):
    endpoint = EndpointConfig(
        backend="transformers", model=str(tiny_chat_model), temperature=0.0, max_tokens=8, device="cpu"
    )
    requests = [ChatRequest(query_messages(QUERY, fmt)) for fmt in (NON_THINKING, THINKING, RL_THINKING)]
    scratch_path = tmp_path / "run" / "heldout_cache.duckdb"
    scratch_path.parent.mkdir()
    with Store(scratch_path) as scratch:
        made = open_client(endpoint, scratch, "sft.heldout.after").complete_sync(requests)
        # A failure recorded in the scratch cache is not an answer: it is not adopted.
        scratch.execute(
            "INSERT INTO llm_cache VALUES ('failed-key', 'r', 'transformers', 'm', '{}', NULL, 'boom', "
            "NULL, NULL, 3, now())"
        )
    with Store(tmp_path / "store.duckdb") as store:
        assert adopt_answers(store, scratch_path) == 3
        assert adopt_answers(store, scratch_path) == 0
        assert adopt_answers(store, tmp_path / "absent.duckdb") == 0
        evaluation = open_client(endpoint, store, "evaluate.sft")
        again = evaluation.complete_sync(requests)
        failed = store.execute("SELECT count(*) FROM llm_cache WHERE key = 'failed-key'").fetchone()[0]
    assert [a.text for a in again] == [a.text for a in made] and all(a.cached for a in again)
    assert evaluation.tally.cached == 3 and evaluation.backend._loaded is None
    assert failed == 0


def test_validation_asks_each_format_as_evaluation_does():
    """A validation score predicts an evaluation one only if the model is asked alike: the same system
    prompt, history and action for the same answer format."""
    from pipeline.prompts.answer_format import FORMATS
    from pipeline.sft.queries import chat_messages

    for name, fmt in FORMATS.items():
        assert chat_messages(QUERY, fmt.system_prompt(QUERY.domain, QUERY.system)) == query_messages(QUERY, name)
    rl = rl_messages(QUERY.domain, QUERY.system, QUERY.history, QUERY.action, None)  # RL's own prompts (no control)
    assert tuple(rl) == query_messages(QUERY, RL_THINKING)


def test_the_demo_validates_with_evaluations_budgets():
    config = load_config(REPO / "data/configs/demo.yaml", [])
    validation, evaluate = config.validation, config.evaluate
    assert validation.max_history_chars == evaluate.max_history_chars
    # A lower cap than evaluation's 200 (its targets' tool-call JSONs need that): the 24 validation targets' p95 is
    # 84 tokens, which the budget check holds the cap to at run time; beyond 128 only loops were written.
    assert 84 <= validation.max_tokens <= evaluate.predictor.max_tokens
    assert evaluate.predictor.backend == "transformers" and evaluate.predictor.temperature == 0.0
