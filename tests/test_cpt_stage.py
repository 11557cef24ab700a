"""The CPT stage end to end on a real DuckDB store: scores required, real training, resume, held-out CE.

The store is filled with SQL (the score and split stages are tested on their own): a small
deterministic terminal world, so a tiny model can learn it in seconds and the held-out
cross-entropy must fall.
"""

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config import SimulacraConfig, load_config
from pipeline.config.score import KeepRatios
from pipeline.errors import UserFixableError
from pipeline.informativeness import SCORER_VERSION
from pipeline.orchestration.faults import InjectedFault
from pipeline.orchestration.fingerprint import stage_fingerprint
from pipeline.sft.base_model import NoCPTCheckpoint, sft_base_ref
from pipeline.store.database import Store
from pipeline.store.snapshot import MissingScores
from pipeline.training.checkpoints import missing_parts
from pipeline.training.divergence import TrainingDiverged
from stages import cpt
from stages import score as score_stage

FILES = {
    "/etc/hostname": "web-01",
    "/etc/os-release": 'NAME="Ubuntu"\nVERSION="22.04.4 LTS (Jammy Jellyfish)"\nID=ubuntu',
    "/app/requirements.txt": "flask==3.0.2\nrequests==2.31.0\ngunicorn==21.2.0",
    "/var/log/app.log": "INFO starting server on port 8080\nWARN slow request /api/users 1.2s\nERROR db timeout",
}
DIRECTORIES = {
    "/app": "app.py  requirements.txt  static  templates",
    "/var/log": "app.log  auth.log  syslog",
    "/etc": "hostname  hosts  os-release",
}
WORDS = "deploy build test release fix merge branch commit push pull".split()
POOL_WEIGHTS = (("cpt", 0.7), ("val", 0.2), ("sft", 0.1))


def terminal_turn(rng: random.Random) -> tuple[str, str, str]:
    """(action, observation, category) from a small deterministic shell."""
    kind = rng.choice(["cat", "ls", "echo", "wc", "missing"])
    if kind == "cat":
        path = rng.choice(sorted(FILES))
        return f"cat {path}", FILES[path], "retrieval"
    if kind == "ls":
        path = rng.choice(sorted(DIRECTORIES))
        return f"ls {path}", DIRECTORIES[path], "retrieval"
    if kind == "echo":
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
        return f"echo {words}", words, "echo"
    if kind == "wc":
        path = rng.choice(sorted(FILES))
        return f"wc -l {path}", f"{FILES[path].count(chr(10)) + 1} {path}", "transform"
    name = rng.choice(WORDS)
    return f"cat /tmp/{name}", f"cat: /tmp/{name}: No such file or directory", "boilerplate"


def fill_store(store: Store, n_trajectories: int = 50, scored: bool = True, seed: int = 0) -> None:
    """Trajectories, kept and split; with `scored`, their scores as `simulacra score` writes them under
    the default `score` section (the categories are the shell's, not the scorer's)."""
    rng = random.Random(seed)
    keep = KeepRatios()
    score_hash = SimulacraConfig().section_hash("score")
    with store.transaction() as tx:
        for t in range(n_trajectories):
            trajectory_id = f"traj-{t:03d}"
            turns = [terminal_turn(rng) for _ in range(rng.randint(4, 12))]
            tx.execute(
                "INSERT INTO trajectories (trajectory_id, source, format, domain, task_description, action_space, "
                "num_turns, location, ingested_at) VALUES (?, 'synthetic', 'simulacra', 'terminal', ?, ?, ?, 'test', now())",
                [trajectory_id, "Inspect the web server.", "bash commands, one per turn", len(turns)],
            )
            tx.execute("INSERT INTO filter_state VALUES (?, 'test', true, ?)", [trajectory_id, len(turns)])
            pool = rng.choices([p for p, _ in POOL_WEIGHTS], [w for _, w in POOL_WEIGHTS])[0]
            tx.execute(
                "INSERT INTO splits (trajectory_id, pool, config_hash, assigned_at) VALUES (?, ?, 'test', now())",
                [trajectory_id, pool],
            )
            for index, (action, observation, category) in enumerate(turns):
                tx.execute(
                    "INSERT INTO turns (trajectory_id, turn_index, action, observation, is_error) VALUES (?, ?, ?, ?, false)",
                    [trajectory_id, index, action, observation],
                )
                if scored:
                    tx.execute(
                        "INSERT INTO turn_scores (trajectory_id, turn_index, category, keep_ratio, scorer_version, "
                        "config_hash) VALUES (?, ?, ?, ?, ?, ?)",
                        [trajectory_id, index, category, keep.of(category), SCORER_VERSION, score_hash],
                    )


def cpt_config(tmp_path, **cpt_fields):
    world = tmp_path / "world.txt"
    if not world.exists():  # written once per workspace: the tests rerun the stage on the same inputs
        world.write_text("Gunicorn is a Python WSGI HTTP server for UNIX. Flask is a lightweight web framework. " * 200)
    fields = {
        "max_steps": 24,
        "save_steps": 8,
        "tokens_per_step": 1024,
        "micro_batch_rows": 4,
        "max_length": 256,
        "learning_rate": 3e-3,
        "world_knowledge": [str(world)],
        "world_knowledge_token_ratio": 0.2,
        # The shell's echoes (2-6 words) are shorter than the default outcome head, which would label them
        # whole; these tests read the keep ratios themselves (the head: the test after the next).
        "outcome_head_tokens": 0,
        **cpt_fields,
    }
    return load_config(None, [{"workspace": {"path": str(tmp_path / "workspace")}, "cpt": fields}])


def test_unscored_turns_stop_the_stage_with_what_to_run(tmp_path):
    config = cpt_config(tmp_path)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=5, scored=False)
        with pytest.raises(MissingScores, match="run `simulacra score` first"):
            cpt.run(config, store)


def test_scores_of_another_score_config_stop_the_stage_until_rescored(tmp_path):
    """Issue 13: `--set score.keep_ratios.echo=0.9 cpt` trained on the old ratios without a word."""
    config = cpt_config(tmp_path, max_steps=2, save_steps=2)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=12, scored=False)
        score_stage.run(config, store)
        before = stage_fingerprint(config, store, "cpt")
        echo_kept = config.model_copy(deep=True)
        echo_kept.score.keep_ratios.echo = 0.9
        with pytest.raises(MissingScores, match=r"scored under another `score` config .*: run `simulacra score`"):
            cpt.run(echo_kept, store)
        score_stage.run(echo_kept, store)
        result = cpt.run(echo_kept, store)
    assert result.metrics["fingerprint"] != before
    assert result.metrics["label_fraction_content.echo"] == pytest.approx(0.9, abs=0.05)


def test_the_outcome_head_reaches_the_training_labels(tmp_path):
    """`cpt.outcome_head_tokens` longer than any of the shell's echoes: every echo is labelled whole, end token
    included, while the keep ratio still says 0.05 (tests/test_sequences.py checks the head's positions)."""
    config = cpt_config(tmp_path, max_steps=1, save_steps=1, outcome_head_tokens=64)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=12)
        metrics = cpt.run(config, store).metrics
    assert metrics["label_fraction_content.echo"] == metrics["label_fraction_end.echo"] == 1.0
    assert metrics["label_fraction_content.boilerplate"] == 1.0


def test_a_corpus_smaller_than_the_ratio_is_used_whole_and_the_summary_says_so(tmp_path):
    """The demo's corpus holds 0.15 of its trajectories' labels where 0.2 is configured: a raised ratio changes
    nothing, and the summary says what was reached rather than let the setting look applied."""
    (tmp_path / "world.txt").write_text("Gunicorn is a Python WSGI HTTP server for UNIX. " * 20)  # a short corpus
    config = cpt_config(tmp_path, max_steps=1, save_steps=1, world_knowledge_token_ratio=10.0)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=12)
        result = cpt.run(config, store)
    metrics = result.metrics
    assert 0 < metrics["world_knowledge_ratio"] < 10.0
    reached = f"a ratio of {metrics['world_knowledge_ratio']:.2f} where 10 was asked"
    labels = f"{metrics['world_knowledge_label_tokens']:,} labels"
    assert f"world-knowledge chunks (the whole corpus, {labels}: {reached})" in result.summary
    # At a ratio the corpus holds, nothing is said.
    assert "whole corpus" not in cpt._summary({**metrics, "world_knowledge_ratio_configured": 0.01})
    # The steps' share of an epoch: under one, which rows were trained on is the shuffle's draw.
    assert result.summary.startswith(f"1 steps ({metrics['epochs']:.2f} of an epoch) on ")
    assert cpt._summary({**metrics, "epochs": 2.5}).startswith("1 steps (2.50 epochs) on ")


def test_domain_balance_repeats_the_smaller_domain_until_the_domains_share_alike(tmp_path):
    """`cpt.domain_balance` 0 on a pool where one domain holds a fraction of the tokens: its windows are repeated, each
    copy with its own keep-ratio masks, until it is half of what CPT trains on; no window of the larger domain is
    left out or repeated, and the summary says the shares. At 1 (the default) every window is written once."""
    once_config = cpt_config(tmp_path, max_steps=1, save_steps=1)
    weighed_config = cpt_config(tmp_path, max_steps=1, save_steps=1, domain_balance=0.0)
    with Store(once_config.workspace.database_path) as store:
        fill_store(store, n_trajectories=40)
        store.execute("UPDATE trajectories SET domain = 'text-game' WHERE trajectory_id <= 'traj-007'")
        once, weighed = (cpt.prepare(config, store) for config in (once_config, weighed_config))
    assert once.sequences_dir != weighed.sequences_dir  # another fingerprint, another run
    once_stats, stats = (json.loads((plan.sequences_dir / "stats.json").read_text()) for plan in (once, weighed))
    assert once_stats["trajectory_sequences"] == once_stats["trajectory_windows"]
    assert once_stats["domain_tokens_trained"] == once_stats["domain_tokens"]
    assert once_stats["domain_factors"] == {"terminal": 1.0, "text-game": 1.0}

    pool, trained = stats["domain_tokens"], stats["domain_tokens_trained"]
    assert pool == once_stats["domain_tokens"] and pool["text-game"] < pool["terminal"] / 2
    assert stats["domain_factors"]["terminal"] == 1.0 and trained["terminal"] == pool["terminal"]
    assert trained["text-game"] / sum(trained.values()) == pytest.approx(0.5, abs=0.08)

    def windows(plan):
        table = pq.read_table(plan.sequences_dir / "train.parquet").to_pylist()
        rows = [row for row in table if row["kind"] == "trajectory"]
        return {(row["source"], row["turn_indices"][0]): [] for row in rows}, rows

    pool_windows, _ = windows(once)
    by_window, rows = windows(weighed)
    assert set(by_window) == set(pool_windows)  # every window of the pool, none lost
    for row in rows:
        by_window[(row["source"], row["turn_indices"][0])].append(row)
    factor = stats["domain_factors"]["text-game"]
    for (source, _), written in by_window.items():
        game = source <= "traj-007"
        assert len(written) in ((math.floor(factor), math.ceil(factor)) if game else (1,))
        assert len({tuple(row["input_ids"]) for row in written}) == 1
        seeds = [tuple(row["mask_seed"]) for row in written]
        assert len(set(seeds)) == len(seeds) or not any(seeds)  # each copy its own masks
        # Each copy names its domain, which the row order balances (pipeline/training/row_order.py).
        assert {row["stratum"] for row in written} == {"text-game" if game else "terminal"}
    documents = [
        row for row in pq.read_table(weighed.sequences_dir / "train.parquet").to_pylist() if row["kind"] != "trajectory"
    ]
    assert documents and {row["stratum"] for row in documents} == {"world_knowledge"}
    assert not (weighed.sequences_dir / "trajectory_windows.parquet").exists()  # the staging file is gone

    # The run's metrics (flat, as metrics.json holds them) carry the per-domain numbers, and the summary the shares.
    with Store(weighed_config.workspace.database_path) as store:
        result = cpt.run(weighed_config, store)
    assert result.metrics["domain_factors.text-game"] == factor and result.metrics["domain_factors.terminal"] == 1.0
    assert result.metrics["domain_tokens_trained.text-game"] == trained["text-game"]
    shares = ", ".join(
        f"{domain} {pool[domain] / sum(pool.values()):.0%} -> {trained[domain] / sum(trained.values()):.0%}"
        for domain in ("terminal", "text-game")
    )
    assert f"world-knowledge chunks (domains weighed, balance 0: {shares}); validation" in result.summary
    assert "domains weighed" not in cpt._summary({**result.metrics, "domain_balance": 1.0})


def test_an_empty_cpt_pool_is_an_error_and_an_empty_store_names_ingest(tmp_path):
    config = cpt_config(tmp_path)
    with Store(config.workspace.database_path) as store:
        with pytest.raises(RuntimeError, match="the store holds no trajectory: run `simulacra ingest` first"):
            cpt.run(config, store)
        fill_store(store, n_trajectories=5)
        store.execute("UPDATE splits SET pool = 'eval' WHERE pool = 'cpt'")
        with pytest.raises(RuntimeError, match="pool 'cpt' holds no trajectory: run `simulacra split` first"):
            cpt.run(config, store)


def manual_observation_ce(model_dir, eval_parquet) -> float:
    """Held-out CE recomputed outside the Trainer: sum of per-token CE over labels / number of labels."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    for row in pq.read_table(eval_parquet).to_pylist():
        ids, labels = torch.tensor([row["input_ids"]]), torch.tensor(row["labels"])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        target = labels[1:]
        keep = target != -100
        total += torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum").item()
        count += int(keep.sum())
    return total / count


def test_cpt_trains_resumes_from_its_checkpoint_and_lowers_held_out_ce(tmp_path):
    # In the stratified row order (pipeline/training/row_order.py): the resume skips what that order trained.
    config = cpt_config(tmp_path, row_order="stratified")
    config.orchestration.fail_stage = "cpt"  # fails once per workspace, after the first checkpoint
    config.workspace.keep_resume_checkpoints = True  # the rotation below is checked on the kept checkpoints
    with Store(config.workspace.database_path) as store:
        fill_store(store)
        with pytest.raises(InjectedFault, match="step 8"):
            cpt.run(config, store)
        assert store.scalar("SELECT count(*) FROM checkpoints") == 0
    [run_dir] = [p for p in (tmp_path / "workspace" / "runs" / "cpt").iterdir() if (p / "fingerprint.json").is_file()]
    assert [p.name for p in (run_dir / "trainer").iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-8"]
    assert not (run_dir / "metrics.json").exists()

    with Store(config.workspace.database_path) as store:
        result = cpt.run(config, store)
        registered = store.rows("SELECT * FROM checkpoints")
    metrics = result.metrics
    # Resumed at the saved step, not from 0, and finished the configured steps.
    assert (metrics["resumed_from_step"], metrics["first_step_this_run"], metrics["global_step"]) == (8, 8, 24)
    # Packed rows of 256 tokens, 4 a step, on the CPU's attention path (each sequence on its own) and loss.
    assert (metrics["attention_implementation"], metrics["loss_implementation"], metrics["tokens_per_step"]) == (
        "simulacra_segments",
        "chunked",
        1024,
    )
    assert metrics["eval_observation_ce_after"] < metrics["eval_observation_ce_before"]
    assert metrics["eval_observation_tokens_scored"] == metrics["eval_observation_tokens"] > 500
    assert result.output_path == run_dir / "model"
    assert [(r["stage"], r["path"]) for r in registered] == [("cpt", str(run_dir / "model"))]
    assert result.images["cpt-loss-curve"].stat().st_size > 0
    # Checkpoints are published whole and rotated in place (save_total_limit=2): the staging folder is empty.
    assert sorted(p.name for p in (run_dir / "trainer").glob("checkpoint-*")) == ["checkpoint-16", "checkpoint-24"]
    assert list((run_dir / "trainer" / "staging").iterdir()) == []

    # The reported CE is the per-token mean over every eval observation token, recomputed by hand.
    assert manual_observation_ce(run_dir / "model", run_dir / "sequences" / "eval.parquet") == pytest.approx(
        metrics["eval_observation_ce_after"], rel=1e-4
    )
    # Training data: world knowledge at the configured ratio of loss tokens, echo observations thinned
    # (content and end tokens alike), retrieval whole.
    assert metrics["world_knowledge_ratio"] == pytest.approx(0.2, abs=0.01)
    assert metrics["world_knowledge_label_tokens"] == pytest.approx(0.2 * metrics["trajectory_label_tokens"], abs=2)
    assert metrics["label_fraction_content.retrieval"] == metrics["label_fraction_end.retrieval"] == 1.0
    assert metrics["label_fraction_content.echo"] < 0.2 and metrics["label_fraction_end.echo"] < 0.2
    # Each epoch draws its own masks: the resumed run set every epoch from the one holding step 8 to the last.
    first, last = metrics["mask_epochs"][0], math.ceil(metrics["epochs"]) - 1
    assert last > first and metrics["mask_epochs"] == list(range(first, last + 1))
    kinds = pq.read_table(run_dir / "sequences" / "train.parquet", columns=["kind"]).column("kind").to_pylist()
    assert set(kinds) == {"trajectory", "world_knowledge"}
    assert json.loads((run_dir / "model" / "generation_config.json").read_text())["eos_token_id"] is not None

    # A rerun with the same inputs trains nothing and registers nothing twice.
    with Store(config.workspace.database_path) as store:
        again = cpt.run(config, store)
        assert store.scalar("SELECT count(*) FROM checkpoints") == 1
    assert again.summary.startswith("already trained")
    assert again.metrics["global_step"] == 24

    # Killed after the last checkpoint was on disk, before metrics.json (issue 20.12): the rerun finishes
    # from checkpoint-24 without another optimizer step, to the same model.
    (run_dir / "metrics.json").unlink()
    shutil.rmtree(run_dir / "model")
    with Store(config.workspace.database_path) as store:
        finished = cpt.run(config, store)
    assert (
        finished.metrics["resumed_from_step"],
        finished.metrics["first_step_this_run"],
        finished.metrics["global_step"],
    ) == (24, None, 24)
    assert finished.metrics["eval_observation_ce_after"] == pytest.approx(
        metrics["eval_observation_ce_after"], rel=1e-5
    )
    assert finished.metrics["eval_observation_ce_before"] == metrics["eval_observation_ce_before"]

    # A completed run's resume checkpoints go when the workspace does not keep them, on the run that
    # completes it or, as here, on a later one that finds it complete; the model and its registration stay.
    config.workspace.keep_resume_checkpoints = False
    with Store(config.workspace.database_path) as store:
        again = cpt.run(config, store)
        assert store.rows("SELECT path FROM checkpoints") == [{"path": str(run_dir / "model")}]
    assert again.summary.startswith("already trained") and again.metrics == finished.metrics
    assert (
        list((run_dir / "trainer").glob("checkpoint-*")) == [] and (run_dir / "model" / "model.safetensors").is_file()
    )


def test_training_reads_only_the_prepared_files_and_the_data_side_records_it(tmp_path):
    """The split a GPU pool uses (flows/gpu_stage.py): `prepare` reads the store; `train`, given the
    plan as a GPU worker receives it and with the store moved away, trains and creates no store;
    `record` registers the checkpoint back on the data side."""
    config = cpt_config(tmp_path, max_steps=4, save_steps=2)
    database = config.workspace.database_path
    with Store(database) as store:
        fill_store(store, n_trajectories=20)
        prepared = cpt.prepare(config, store)
    plan = cpt.Plan.read(prepared.write())
    assert plan == prepared
    aside = database.rename(database.with_name("elsewhere.duckdb"))
    cpt.train(config, plan)
    assert not database.exists()
    aside.rename(database)
    with Store(database) as store:
        result = cpt.record(store, plan)
        registered = store.rows("SELECT stage, path FROM checkpoints")
    assert result.metrics["global_step"] == 4
    assert registered == [{"stage": "cpt", "path": str(plan.model_dir)}]


@pytest.mark.slow
def test_two_processes_under_torchrun_train_one_model(tmp_path):
    """The distributed path on CPUs (gloo): only the main process touches the store, both train."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        f"workspace:\n  path: {tmp_path / 'workspace'}\n"
        "cpt:\n  max_steps: 6\n  save_steps: 3\n  micro_batch_rows: 2\n  tokens_per_step: 512\n  max_length: 256\n"
        "  row_order: stratified\n"  # each process deals itself its share of one order
    )
    config = load_config(config_file)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=30)
    repo = Path(__file__).resolve().parents[1]
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        + ["-m", "stages.cpt", "--config", str(config_file)],
        cwd=repo,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "non-main training process" in launched.stdout and "validation observation CE" in launched.stdout
    with Store(config.workspace.database_path) as store:
        [row] = store.rows("SELECT path, metrics FROM checkpoints")
        assert store.rows("SELECT stage, status FROM stage_runs") == [{"stage": "cpt", "status": "completed"}]
    metrics = json.loads(row["metrics"])
    assert metrics["global_step"] == 6
    # The stage's callback set every epoch (accelerate alone does not reach the dataset here).
    assert metrics["mask_epochs"] == list(range(math.ceil(metrics["epochs"])))
    # Split across the two processes and gathered: every eval token scored once.
    assert metrics["eval_observation_tokens_scored"] == metrics["eval_observation_tokens"]
    assert (Path(row["path"]) / "model.safetensors").is_file()


# Run in a child process: the stage's own command, with the Trainer paused inside the save of one
# checkpoint (weights written, optimizer not yet) until the test kills it. The pause is the only
# change; the save path, the files and the kill are real.
PAUSED_IN_CHECKPOINT_WRITE = """
import sys, time
from pathlib import Path
from transformers import Trainer
from stages import cpt

signal_file, step = Path(sys.argv[1]), int(sys.argv[2])
save_optimizer = Trainer._save_optimizer_and_scheduler

def pause_at_step(self, output_dir):
    if self.state.global_step == step:
        signal_file.write_text(output_dir)
        time.sleep(600)
    save_optimizer(self, output_dir)

Trainer._save_optimizer_and_scheduler = pause_at_step
cpt.main(["--config", sys.argv[3]])
"""


@pytest.mark.slow
def test_a_kill_while_a_checkpoint_is_written_resumes_from_the_previous_checkpoint(tmp_path, caplog):
    """Issue 8.1: SIGKILL inside the write of checkpoint-16; the rerun resumes from checkpoint-8."""
    fields = {"max_steps": 16, "save_steps": 8, "tokens_per_step": 1024, "micro_batch_rows": 4, "max_length": 256}
    config_file = tmp_path / "config.yaml"
    # Kept checkpoints: the test reads the re-saved checkpoint-16 after the run completes.
    config_file.write_text(
        yaml.safe_dump(
            {"workspace": {"path": str(tmp_path / "workspace"), "keep_resume_checkpoints": True}, "cpt": fields}
        )
    )
    config = load_config(config_file)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=30)

    in_write = tmp_path / "in-checkpoint-write"
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSED_IN_CHECKPOINT_WRITE, str(in_write), "16", str(config_file)],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not in_write.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert in_write.exists(), f"the child never reached the save of step 16: {child.stderr.read()[-3000:]}"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stderr.close()

    # The kill landed inside the write: checkpoint-16's weights are on disk, its optimizer is not.
    [run_dir] = [p for p in (tmp_path / "workspace" / "runs" / "cpt").iterdir() if (p / "fingerprint.json").is_file()]
    trainer_dir = run_dir / "trainer"
    [cut] = [p for p in trainer_dir.rglob("checkpoint-16") if p.is_dir()]
    assert Path(in_write.read_text()) == cut
    assert (cut / "model.safetensors").is_file() and not (cut / "optimizer.pt").exists()
    assert missing_parts(trainer_dir / "checkpoint-8") == []

    with caplog.at_level("WARNING"), Store(config.workspace.database_path) as store:
        result = cpt.run(config, store)
    metrics = result.metrics
    assert (metrics["resumed_from_step"], metrics["first_step_this_run"], metrics["global_step"]) == (8, 8, 16)
    # The cut folder is kept for inspection, out of the Trainer's way, and the warning names it.
    [kept] = (trainer_dir / "incomplete").iterdir()
    assert kept.name.startswith("checkpoint-16-") and (kept / "model.safetensors").is_file()
    assert any(str(cut) in record.getMessage() and str(kept) in record.getMessage() for record in caplog.records)
    assert missing_parts(trainer_dir / "checkpoint-16") == []
    assert (run_dir / "model" / "model.safetensors").is_file()


def test_a_learning_rate_that_breaks_the_weights_fails_the_stage_and_registers_nothing(tmp_path):
    """A finite rate far too large trained the weights to NaN; the stage reported "CE 6.238 -> nan", registered
    the checkpoint, and SFT trained on from it (status 0). (An infinite rate is refused by the config.)"""
    config = cpt_config(tmp_path, max_steps=3, save_steps=3, learning_rate=1e30)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=12)
        with pytest.raises(TrainingDiverged, match=r"weights not finite after step 3 .*cpt.learning_rate 1e\+30"):
            cpt.run(config, store)
        assert store.scalar("SELECT count(*) FROM checkpoints") == 0
    assert not list((tmp_path / "workspace" / "runs" / "cpt").glob("*/model"))


def test_a_finished_run_whose_model_was_deleted_names_the_folder_to_remove_and_sft_says_why(tmp_path):
    """`rm -rf runs/cpt/<fp>/model`: cpt answered "already trained" (registering the missing folder again) and sft
    "none is registered: run `simulacra cpt` first", each sending the user to the other."""
    config = cpt_config(tmp_path, max_steps=2, save_steps=2)
    with Store(config.workspace.database_path) as store:
        fill_store(store, n_trajectories=12)
        first = cpt.run(config, store)
    # The run records the sections it read in full, beside their hashes: the model card quotes them (stages/export).
    recorded = json.loads((first.output_path.parent / "fingerprint.json").read_text())
    assert recorded["settings"]["cpt"]["max_steps"] == 2 and set(recorded["settings"]) == set(
        recorded["inputs"]["config"]
    )
    shutil.rmtree(first.output_path)
    run_dir = first.output_path.parent
    with Store(config.workspace.database_path) as store:
        with pytest.raises(UserFixableError, match=f"its model folder {first.output_path} is gone or incomplete: put"):
            cpt.run(config, store)
        with pytest.raises(
            NoCPTCheckpoint, match=r"the one registered \(.*\) is no longer on disk: run `simulacra cpt`"
        ):
            sft_base_ref(config, store)
    shutil.rmtree(run_dir)  # what the line says to do
    with Store(config.workspace.database_path) as store:
        again = cpt.run(config, store)
        assert again.output_path == first.output_path and (again.output_path / "config.json").is_file()
        assert sft_base_ref(config, store) == str(again.output_path)
