"""Schema migrations of the store, applied in order and recorded in `schema_migrations`.

Append new migrations at the end; never edit or drop one that has shipped (workspaces in the
field have applied it). A migration is a list of statements run in one transaction; a `RowSweep` among
them runs only where its table holds rows.
"""

from dataclasses import dataclass

from pipeline.secret_shapes import sql_redact_rows


@dataclass(frozen=True, slots=True)
class RowSweep:
    """A statement that only rewrites rows already in `table`, run only where the table holds some. On a new store
    every table is empty and the statement would change nothing, yet DuckDB compiles its regular expressions
    whatever the rows: migration 12's sweeps made a new store 1.6x as slow to create (bench/new_store.py)."""

    table: str
    sql: str


# Every column that holds text from a trajectory, a model or an error, table by table: what migration 12 sweeps
# for credentials that a store ingested before ingest redacted them may hold (pipeline/secret_shapes.py). Written
# out, not derived from the tables' definitions elsewhere: a shipped migration must not change when they do.
TEXT_COLUMNS = {
    "trajectories": (
        "task",
        "task_description",
        "action_space",
        "tools",
        "initial_state",
        "demonstrations",
        "simulation_instructions",
        "metadata",
    ),
    "turns": ("action", "observation", "tool_name", "metadata"),
    "quarantine": ("error", "raw"),
    "filter_decisions": ("reason",),
    "llm_cache": ("request", "answer", "error"),
    "sft_candidates": ("raw_text", "thinking", "prediction", "error"),
    "judgements": ("invalid_reason", "raw_answer"),
    "eval_predictions": ("prediction", "error", "judge_invalid_reason"),
    "rl_prompts": ("instruction",),
    "fidelity_steps": ("prediction", "error"),
    "fidelity_episodes": ("history", "error"),
    "stage_runs": ("metrics", "error", "summary"),
}


# Where a record was read: a keyed file's keys (an AgentBench file's task names) are part of it. Swept from 14 on.
LOCATION_COLUMNS: dict[str, tuple[str, ...]] = {"trajectories": ("location",), "quarantine": ("location",)}


def _credential_sweeps(columns: dict[str, tuple[str, ...]] = TEXT_COLUMNS) -> list[str | RowSweep]:
    """Every text column of a table that holds rows, scanned once for every credential shape of today; rows are
    rewritten only where they match."""
    return [RowSweep(table, sql_redact_rows(table, names)) for table, names in columns.items()]


MIGRATIONS: list[tuple[int, str, list[str | RowSweep]]] = [
    (
        1,
        "trajectory store",
        [
            """CREATE TABLE sources (
                name VARCHAR PRIMARY KEY,
                first_seen TIMESTAMP NOT NULL,
                last_ingested TIMESTAMP NOT NULL
            )""",
            # One row per (file, content, source): how far ingestion got, committed with each batch,
            # so a killed run resumes after the last committed record and the nightly refresh skips
            # files it has completed.
            """CREATE TABLE ingested_files (
                path VARCHAR NOT NULL,
                sha256 VARCHAR NOT NULL,
                source VARCHAR NOT NULL,
                format VARCHAR,
                size_bytes BIGINT NOT NULL,
                records_read BIGINT NOT NULL,
                added BIGINT NOT NULL,
                duplicates BIGINT NOT NULL,
                quarantined BIGINT NOT NULL,
                completed BOOLEAN NOT NULL,
                updated_at TIMESTAMP NOT NULL,
                PRIMARY KEY (path, sha256, source)
            )""",
            """CREATE TABLE trajectories (
                trajectory_id VARCHAR PRIMARY KEY,
                source VARCHAR NOT NULL,
                format VARCHAR NOT NULL,
                domain VARCHAR NOT NULL,
                task VARCHAR,
                task_description VARCHAR NOT NULL,
                action_space VARCHAR,
                tools JSON,
                initial_state VARCHAR,
                demonstrations VARCHAR,
                simulation_instructions VARCHAR,
                outcome_reward DOUBLE,
                num_turns INTEGER NOT NULL,
                metadata JSON,
                location VARCHAR NOT NULL,
                ingested_at TIMESTAMP NOT NULL
            )""",
            # No key constraint: turns are only ever inserted with their (new) trajectory, in the
            # same transaction, so (trajectory_id, turn_index) is unique by construction and bulk
            # inserts skip maintaining a second index.
            """CREATE TABLE turns (
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                action VARCHAR NOT NULL,
                observation VARCHAR NOT NULL,
                tool_name VARCHAR,
                is_error BOOLEAN NOT NULL,
                metadata JSON
            )""",
            """CREATE TABLE quarantine (
                quarantine_id VARCHAR PRIMARY KEY,
                source VARCHAR NOT NULL,
                location VARCHAR NOT NULL,
                error VARCHAR NOT NULL,
                raw VARCHAR,
                recorded_at TIMESTAMP NOT NULL
            )""",
            # Every drop, with its rule and reason; turn_index NULL for a whole trajectory.
            """CREATE TABLE filter_decisions (
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER,
                rule VARCHAR NOT NULL,
                reason VARCHAR NOT NULL,
                config_hash VARCHAR NOT NULL,
                decided_at TIMESTAMP NOT NULL
            )""",
            # Which trajectories the filter has judged, under which config: new ones are judged
            # incrementally; a changed config re-judges everything in one transaction.
            """CREATE TABLE filter_state (
                trajectory_id VARCHAR PRIMARY KEY,
                config_hash VARCHAR NOT NULL,
                kept BOOLEAN NOT NULL,
                kept_turns INTEGER NOT NULL
            )""",
            """CREATE TABLE turn_scores (
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                overlap DOUBLE,
                novelty DOUBLE,
                jaccard DOUBLE,
                length_ratio DOUBLE,
                category VARCHAR NOT NULL,
                keep_ratio DOUBLE NOT NULL,
                scorer_version VARCHAR NOT NULL,
                config_hash VARCHAR NOT NULL
            )""",
            """CREATE TABLE splits (
                trajectory_id VARCHAR PRIMARY KEY,
                pool VARCHAR NOT NULL,
                config_hash VARCHAR NOT NULL,
                assigned_at TIMESTAMP NOT NULL
            )""",
            """CREATE TABLE targets (
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                pool VARCHAR NOT NULL,
                strategy VARCHAR NOT NULL,
                seed INTEGER NOT NULL,
                config_hash VARCHAR NOT NULL
            )""",
            """CREATE TABLE stage_runs (
                run_id VARCHAR PRIMARY KEY,
                stage VARCHAR NOT NULL,
                fingerprint VARCHAR NOT NULL,
                status VARCHAR NOT NULL,
                started_at TIMESTAMP NOT NULL,
                finished_at TIMESTAMP,
                metrics JSON,
                output_path VARCHAR,
                error VARCHAR
            )""",
            """CREATE TABLE checkpoints (
                checkpoint_id VARCHAR PRIMARY KEY,
                stage VARCHAR NOT NULL,
                fingerprint VARCHAR NOT NULL,
                path VARCHAR NOT NULL,
                base_model VARCHAR,
                created_at TIMESTAMP NOT NULL,
                metrics JSON
            )""",
            """CREATE VIEW kept_trajectories AS
                SELECT t.* FROM trajectories t JOIN filter_state f USING (trajectory_id) WHERE f.kept""",
            """CREATE VIEW kept_turns AS
                SELECT u.* FROM turns u JOIN filter_state f USING (trajectory_id)
                WHERE f.kept AND NOT EXISTS (
                    SELECT 1 FROM filter_decisions d
                    WHERE d.trajectory_id = u.trajectory_id AND d.turn_index = u.turn_index)""",
        ],
    ),
    (
        2,
        "stage run summaries",
        [
            # The stage's one-line summary, so a skipped stage reports what its completed run did.
            "ALTER TABLE stage_runs ADD COLUMN summary VARCHAR",
        ],
    ),
    (
        3,
        "pool group keys",
        [
            # What placed the trajectory: all trajectories of one group (a task, a configured metadata
            # field, else the trajectory alone) share a pool (issue 13). NULL in rows written before
            # this migration; the next `simulacra split` replaces them.
            "ALTER TABLE splits ADD COLUMN group_key VARCHAR",
        ],
    ),
    (
        4,
        "llm answer cache",
        [
            # One row per request the LLM client has settled (pipeline/llm/cache.py): the answer, or the
            # error of its last attempt (a rerun retries those). `key` hashes backend, model, messages,
            # sampling parameters, response format and sample index, never the API key or base URL.
            """CREATE TABLE llm_cache (
                key VARCHAR PRIMARY KEY,
                role VARCHAR NOT NULL,
                backend VARCHAR NOT NULL,
                model VARCHAR NOT NULL,
                request JSON NOT NULL,
                answer VARCHAR,
                error VARCHAR,
                prompt_tokens INTEGER,
                completion_tokens INTEGER,
                attempts INTEGER NOT NULL,
                created_at TIMESTAMP NOT NULL
            )""",
        ],
    ),
    (
        5,
        "rejection-sampled sft",
        [
            # One row per candidate of a query (issue 10): kept whether or not it parsed. A query is a
            # target turn of the sft pool (`query_id` = trajectory_id:turn_index); `candidate_id` is a
            # hash of (query, generator, sample index), so a rerun finds what it already has.
            """CREATE TABLE sft_candidates (
                candidate_id VARCHAR PRIMARY KEY,
                query_id VARCHAR NOT NULL,
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                domain VARCHAR NOT NULL,
                generator VARCHAR NOT NULL,
                sample_index INTEGER NOT NULL,
                raw_text VARCHAR,
                thinking VARCHAR,
                prediction VARCHAR,
                parse_status VARCHAR NOT NULL,
                error VARCHAR,
                prompt_tokens INTEGER,
                completion_tokens INTEGER,
                created_at TIMESTAMP NOT NULL
            )""",
            # Pointwise (one candidate against the reference) and pairwise (two candidates, in one
            # order) judgements. Criteria are NULL for a similarity judge and for an invalid answer;
            # `score` is the mean of the criteria (0 when invalid); `winner` is A, B or tie (pairwise).
            """CREATE TABLE judgements (
                judgement_id VARCHAR PRIMARY KEY,
                kind VARCHAR NOT NULL,
                query_id VARCHAR NOT NULL,
                judge VARCHAR NOT NULL,
                candidate_a VARCHAR NOT NULL,
                candidate_b VARCHAR,
                format DOUBLE,
                factuality DOUBLE,
                consistency DOUBLE,
                realism DOUBLE,
                quality DOUBLE,
                score DOUBLE,
                winner VARCHAR,
                valid BOOLEAN NOT NULL,
                invalid_reason VARCHAR,
                raw_answer VARCHAR,
                created_at TIMESTAMP NOT NULL
            )""",
            # The decision per query: kept (a sample) or discarded, with what decided it.
            """CREATE TABLE sft_samples (
                query_id VARCHAR NOT NULL,
                selection VARCHAR NOT NULL,
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                domain VARCHAR NOT NULL,
                kept BOOLEAN NOT NULL,
                reason VARCHAR NOT NULL,
                winner VARCHAR,
                runner_up VARCHAR,
                decided_by VARCHAR,
                score DOUBLE,
                template_id INTEGER,
                created_at TIMESTAMP NOT NULL,
                PRIMARY KEY (query_id, selection)
            )""",
        ],
    ),
    (
        7,
        "evaluation",
        [
            # One row per evaluation (issue 12): one model (a registered checkpoint, the base model, the
            # retrieval baseline or a folder given by path) on one eval set with one judge. Its id hashes
            # the three fingerprints, so an evaluation done with the same three is found, not recomputed;
            # `completed` is set when every query has its row and the aggregates are written.
            """CREATE TABLE evaluations (
                evaluation_id VARCHAR PRIMARY KEY,
                checkpoint_id VARCHAR NOT NULL,
                model VARCHAR NOT NULL,
                stage VARCHAR NOT NULL,
                model_path VARCHAR,
                prompt_format VARCHAR NOT NULL,
                checkpoint_fingerprint VARCHAR NOT NULL,
                eval_set VARCHAR NOT NULL,
                eval_set_fingerprint VARCHAR NOT NULL,
                judge VARCHAR NOT NULL,
                judge_fingerprint VARCHAR NOT NULL,
                queries INTEGER NOT NULL,
                completed BOOLEAN NOT NULL,
                created_at TIMESTAMP NOT NULL,
                completed_at TIMESTAMP
            )""",
            # One row per (evaluation, target turn), committed a batch at a time as they are produced:
            # the prediction, how it parsed, the judge's criteria (1-5, NULL for the similarity judge) and
            # mean, and the judge-free metrics. A rerun after a kill computes only the missing rows.
            """CREATE TABLE eval_predictions (
                evaluation_id VARCHAR NOT NULL,
                query_id VARCHAR NOT NULL,
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                domain VARCHAR NOT NULL,
                prediction VARCHAR,
                parse_status VARCHAR NOT NULL,
                error VARCHAR,
                format DOUBLE,
                factuality DOUBLE,
                consistency DOUBLE,
                realism DOUBLE,
                quality DOUBLE,
                judge_raw DOUBLE,
                judge_valid BOOLEAN,
                judge_invalid_reason VARCHAR,
                similarity DOUBLE,
                semantic_match BOOLEAN,
                rouge_l DOUBLE,
                exact_match BOOLEAN,
                json_valid BOOLEAN,
                ce_sum DOUBLE,
                ce_tokens INTEGER,
                created_at TIMESTAMP NOT NULL,
                PRIMARY KEY (evaluation_id, query_id)
            )""",
            # The table: per evaluation, one row per domain and one for all (`domain` = 'all'). Scores are
            # AgentWorldBench's (raw - 1) / 4 x 100; rates are fractions; CE is nats per observation token.
            """CREATE TABLE eval_results (
                evaluation_id VARCHAR NOT NULL,
                domain VARCHAR NOT NULL,
                queries INTEGER NOT NULL,
                judged INTEGER NOT NULL,
                score DOUBLE,
                format DOUBLE,
                factuality DOUBLE,
                consistency DOUBLE,
                realism DOUBLE,
                quality DOUBLE,
                unparsed INTEGER NOT NULL,
                failed INTEGER NOT NULL,
                judge_invalid INTEGER NOT NULL,
                observation_ce DOUBLE,
                perplexity DOUBLE,
                semantic_match DOUBLE,
                rouge_l DOUBLE,
                exact_match DOUBLE,
                json_valid DOUBLE,
                json_references INTEGER NOT NULL,
                PRIMARY KEY (evaluation_id, domain)
            )""",
        ],
    ),
    (
        8,
        "rl prompts",
        [
            # The prompts of each GSPO run (issue 11), keyed by the run's fingerprint: one target turn per
            # trajectory, whether its turn carries a verifier, and which control instruction it got
            # (NULL: none), so the faults a run taught can be listed and audited.
            """CREATE TABLE rl_prompts (
                run VARCHAR NOT NULL,
                prompt_index INTEGER NOT NULL,
                trajectory_id VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                domain VARCHAR NOT NULL,
                has_verifier BOOLEAN NOT NULL,
                control VARCHAR,
                instruction VARCHAR,
                created_at TIMESTAMP NOT NULL,
                PRIMARY KEY (run, prompt_index)
            )""",
        ],
    ),
    (
        9,
        "evaluation: parse rate, trained-format cross-entropy, targets seen in training",
        [
            # Issue 17: whether a target's (action, observation) pair is a kept turn of a training pool
            # (the split's overlap rule), so the table reports scores with and without such targets.
            "ALTER TABLE eval_predictions ADD COLUMN seen_in_training BOOLEAN",
            # Answers that parsed in the model's format (the parse rate's numerator), rows with a
            # cross-entropy (a thinking model's unparsed answers have none), and the score without the
            # targets seen in training.
            "ALTER TABLE eval_results ADD COLUMN parsed INTEGER",
            "ALTER TABLE eval_results ADD COLUMN ce_rows INTEGER",
            "ALTER TABLE eval_results ADD COLUMN seen INTEGER",
            "ALTER TABLE eval_results ADD COLUMN score_unseen DOUBLE",
        ],
    ),
    (
        10,
        "evaluation: benchmark items, empty generations, strict agreement, macro mean",
        [
            # Issue 18: the history turns a benchmark item left out (0: the full history), the whole
            # observation's exact agreement and the share of its lines in agreement, per row.
            "ALTER TABLE eval_predictions ADD COLUMN history_left_out INTEGER",
            "ALTER TABLE eval_predictions ADD COLUMN exact BOOLEAN",
            "ALTER TABLE eval_predictions ADD COLUMN line_agreement DOUBLE",
            # Empty generations (counted, left out of every mean), the two agreements per domain, and on
            # the `all` row the macro mean over domains beside the sample-weighted `score`.
            "ALTER TABLE eval_results ADD COLUMN empty INTEGER",
            "ALTER TABLE eval_results ADD COLUMN exact DOUBLE",
            "ALTER TABLE eval_results ADD COLUMN line_agreement DOUBLE",
            "ALTER TABLE eval_results ADD COLUMN score_macro DOUBLE",
            "ALTER TABLE eval_results ADD COLUMN domains INTEGER",
        ],
    ),
    (
        11,
        "fidelity: scored rollout steps, episodes, the numbers a model card quotes",
        [
            # Issue 31: every scored step of a closed- or open-loop rollout, committed a step at a time as it is
            # scored, so a killed `simulacra fidelity` scores no step twice. `inputs` fingerprints what the
            # steps depend on besides the simulator (the held-out trajectories, how they are asked, the judge,
            # the code); `simulator` is the model's fingerprint (or the retrieval baseline's).
            """CREATE TABLE fidelity_steps (
                inputs VARCHAR NOT NULL,
                simulator VARCHAR NOT NULL,
                trajectory_id VARCHAR NOT NULL,
                mode VARCHAR NOT NULL,
                step INTEGER NOT NULL,
                domain VARCHAR NOT NULL,
                turn_index INTEGER NOT NULL,
                history_left_out INTEGER NOT NULL,
                prediction VARCHAR,
                parse_status VARCHAR NOT NULL,
                score DOUBLE,
                similarity DOUBLE,
                exact_match BOOLEAN,
                error VARCHAR,
                created_at TIMESTAMP NOT NULL,
                PRIMARY KEY (inputs, simulator, trajectory_id, mode, step)
            )""",
            # Every episode a policy played, in a real environment (`simulator` = 'real') or a simulator, each
            # committed as it ends: how it ended (success, stopped, terminated, truncated; `failed` when the
            # simulator's request failed, which the next run plays again) and its (action, observation) pairs.
            """CREATE TABLE fidelity_episodes (
                inputs VARCHAR NOT NULL,
                simulator VARCHAR NOT NULL,
                environment VARCHAR NOT NULL,
                policy VARCHAR NOT NULL,
                seed INTEGER NOT NULL,
                success BOOLEAN NOT NULL,
                steps INTEGER NOT NULL,
                ending VARCHAR NOT NULL,
                history JSON NOT NULL,
                error VARCHAR,
                created_at TIMESTAMP NOT NULL,
                PRIMARY KEY (inputs, simulator, environment, policy, seed)
            )""",
            # One row per (fidelity report, model): the numbers the exported model card quotes (median steps to
            # the first divergence, closed against open loop at one step, Kendall's tau), as JSON, and the report.
            """CREATE TABLE fidelity_reports (
                report_id VARCHAR NOT NULL,
                checkpoint_id VARCHAR NOT NULL,
                model VARCHAR NOT NULL,
                stage VARCHAR NOT NULL,
                judge VARCHAR NOT NULL,
                headline JSON NOT NULL,
                report_path VARCHAR NOT NULL,
                created_at TIMESTAMP NOT NULL,
                PRIMARY KEY (report_id, checkpoint_id)
            )""",
        ],
    ),
    (
        12,
        "credentials redacted from what is already stored",
        # Ingest redacts credential-shaped text before storing it; a store ingested earlier may hold some, and so
        # may every table built from it. One scan of each text column of a table that holds rows; rows are rewritten
        # only where they match.
        _credential_sweeps(),
    ),
    (
        13,
        "credentials of the shapes added after 12 redacted from what is already stored",
        # Stripe, GitLab, npm, PyPI, SendGrid, Google OAuth, DigitalOcean, JSON Web Tokens, Azure storage keys, AWS
        # secret keys after their name, bearer tokens (pipeline/secret_shapes.py): a store swept by 12 before they
        # were shapes may hold them. The same sweep, with every shape; rows already clean are not rewritten.
        _credential_sweeps(),
    ),
    (
        14,
        "credentials in the forms added after 13 redacted from what is already stored",
        # An AWS secret key after its name in quotes (JSON, YAML, a quoted shell export, `SecretAccessKey` of STS),
        # passwords in URLs, PGP private key blocks, private keys cut before their end line (pipeline/secret_shapes.py),
        # and where each record was read, which ingest now redacts too. The same sweep, and the locations'.
        _credential_sweeps() + _credential_sweeps(LOCATION_COLUMNS),
    ),
    (
        15,
        "file versions: the trajectories each version of a file holds, which version is current, retired trajectories",
        [
            # A file's content is its version (path, sha256, source). Ingest only ever added: the trajectories of a
            # changed file's old version, and of a file deleted from its folder, stayed in every pool (a corrected
            # eval trajectory in eval, its new copy in cpt). Now a version that a newer one of the same path
            # replaced, or whose file a folder's walk no longer finds, is `superseded_at`; a trajectory no current
            # version holds is retired: still stored (nothing is deleted), in no kept view and so in no pool.
            "ALTER TABLE ingested_files ADD COLUMN superseded_at TIMESTAMP",
            # Whether `file_trajectories` holds this version's every record: false for versions read before this
            # migration, which ingest reads once more to record them. Until a source has none left, nothing of it is
            # retired: an unrecorded file may hold any of its trajectories as a duplicate. A trajectory no version
            # holds is retired once its source's current versions are all recorded (one only a legacy version held);
            # one of a source ingest never read (rows a tool wrote) never is.
            "ALTER TABLE ingested_files ADD COLUMN trajectories_recorded BOOLEAN DEFAULT false",
            # Of a path's versions read before, the ones a completed later read replaced.
            """UPDATE ingested_files f SET superseded_at = now()
                WHERE EXISTS (
                    SELECT 1 FROM ingested_files g
                    WHERE g.path = f.path AND g.source = f.source AND g.sha256 <> f.sha256
                    AND g.completed AND g.updated_at > f.updated_at)""",
            """CREATE TABLE file_trajectories (
                path VARCHAR NOT NULL,
                sha256 VARCHAR NOT NULL,
                source VARCHAR NOT NULL,
                trajectory_id VARCHAR NOT NULL,
                PRIMARY KEY (path, sha256, source, trajectory_id)
            )""",
            """CREATE VIEW retired_trajectories AS
                SELECT t.trajectory_id, t.source FROM trajectories t
                WHERE NOT EXISTS (
                    SELECT 1 FROM file_trajectories h JOIN ingested_files f USING (path, sha256, source)
                    WHERE h.trajectory_id = t.trajectory_id AND f.superseded_at IS NULL)
                AND EXISTS (SELECT 1 FROM ingested_files f WHERE f.source = t.source)
                AND NOT EXISTS (
                    SELECT 1 FROM ingested_files f
                    WHERE f.source = t.source AND f.superseded_at IS NULL AND NOT f.trajectories_recorded)""",
            """CREATE OR REPLACE VIEW kept_trajectories AS
                SELECT t.* FROM trajectories t JOIN filter_state f USING (trajectory_id)
                WHERE f.kept AND t.trajectory_id NOT IN (SELECT trajectory_id FROM retired_trajectories)""",
            """CREATE OR REPLACE VIEW kept_turns AS
                SELECT u.* FROM turns u JOIN filter_state f USING (trajectory_id)
                WHERE f.kept AND u.trajectory_id NOT IN (SELECT trajectory_id FROM retired_trajectories)
                AND NOT EXISTS (
                    SELECT 1 FROM filter_decisions d
                    WHERE d.trajectory_id = u.trajectory_id AND d.turn_index = u.turn_index)""",
        ],
    ),
]
