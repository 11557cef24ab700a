"""Evaluation asks nothing the training stages already asked. SFT and RL predict their held-out queries
where training runs, in a scratch answer cache; `record` copies those answers into the store's cache
(pipeline/llm/cache.py `adopt_answers`), and `simulacra evaluate` asks the same checkpoints the same
queries (the first of one seeded ranking) in the same format and sampling, so it finds them there.

- adopted answers are served from the store without loading the model; failures are not adopted;
  adopting twice adds nothing;
- the requests are the same: each stage's held-out messages equal evaluation's for that format;
- the demo config keeps them the same: equal seeds, history, token budgets.
"""

from pathlib import Path

from pipeline.config import load_config
from pipeline.config.llm import EndpointConfig
from pipeline.evaluation.prompting import NON_THINKING, RL_THINKING, THINKING, query_messages
from pipeline.llm.cache import adopt_answers
from pipeline.llm.client import ChatRequest, open_client
from pipeline.prompts.rl import rl_messages
from pipeline.sft.queries import Query, choose_targets
from pipeline.store.database import Store
from pipeline.store.schema import ScoredTurn, SystemPrompt
from stages.sft import _heldout_messages

REPO = Path(__file__).resolve().parents[1]
QUERY = Query(
    trajectory_id="t1", turn_index=2, domain="terminal",
    system=SystemPrompt(task_description="A shell in a fresh home folder.", action_space="bash commands",
                        simulation_instructions="Answer as bash would."),
    history=(ScoredTurn(0, "mkdir notes", "", "action", 1.0), ScoredTurn(1, "ls", "notes\n", "retrieval", 1.0)),
    action="ls notes", reference="", history_left_out=0,
)


def test_adopted_answers_are_served_from_the_store_without_loading_the_model(tiny_chat_model, tmp_path):
    endpoint = EndpointConfig(backend="transformers", model=str(tiny_chat_model), temperature=0.0, max_tokens=8, device="cpu")
    requests = [ChatRequest(query_messages(QUERY, fmt)) for fmt in (NON_THINKING, THINKING, RL_THINKING)]
    scratch_path = tmp_path / "run" / "heldout_cache.duckdb"
    scratch_path.parent.mkdir()
    with Store(scratch_path) as scratch:
        made = open_client(endpoint, scratch, "sft.heldout.after").complete_sync(requests)
        # A failure recorded in the scratch cache is not an answer: it is not adopted.
        scratch.execute("INSERT INTO llm_cache VALUES ('failed-key', 'r', 'transformers', 'm', '{}', NULL, 'boom', "
                        "NULL, NULL, 3, now())")
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


def test_each_stages_heldout_messages_are_evaluations_for_its_format():
    assert _heldout_messages(QUERY, thinking=False) == query_messages(QUERY, NON_THINKING)  # SFT before: CPT's model
    assert _heldout_messages(QUERY, thinking=True) == query_messages(QUERY, THINKING)  # SFT after
    rl = rl_messages(QUERY.domain, QUERY.system, QUERY.history, QUERY.action, None)  # RL after (no control)
    assert tuple(rl) == query_messages(QUERY, RL_THINKING)


def test_the_demo_asks_its_held_out_queries_as_evaluation_does():
    config = load_config(REPO / "data/configs/demo.yaml", [])
    sft, rl, evaluate = config.sft, config.rl, config.evaluate
    # One seeded ranking: a stage's held-out queries are evaluation's first ones.
    targets = [(f"t{i}", i % 5) for i in range(40)]
    ranked = choose_targets(targets, evaluate.max_queries, evaluate.seed)
    assert choose_targets(targets, sft.eval_queries, sft.seed) == ranked[: sft.eval_queries]
    assert choose_targets(targets, rl.eval_queries, rl.seed) == ranked[: rl.eval_queries]
    # The same history and sampling (the held-out endpoints: greedy, the stage's eval_max_tokens, defaults else).
    assert sft.max_history_chars == rl.max_history_chars == evaluate.max_history_chars
    heldout = EndpointConfig(backend="transformers", temperature=0.0, max_tokens=evaluate.predictor.max_tokens)
    predictor = evaluate.predictor
    assert predictor.backend == "transformers"
    assert (predictor.temperature, predictor.top_p, predictor.seed, predictor.stop_on_repetition) == (
        heldout.temperature, heldout.top_p, heldout.seed, heldout.stop_on_repetition)
    assert sft.eval_max_tokens == rl.eval_max_tokens == predictor.max_tokens
