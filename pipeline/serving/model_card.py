"""The model card (README.md) of an exported world model: what it was trained on and how.

Issue 12: sources, trajectory and turn counts per domain and pool, each stage's fingerprint and
settings, and the evaluation table (issue 31: and the exported checkpoint's fidelity numbers, where
`simulacra fidelity` measured it). Issue 19: the Hub's conventions, YAML front matter with
`license` (the base model's), `base_model`, `pipeline_tag`, `tags`, `datasets` (the sources by name)
and `model-index` (the evaluation results), a complete example request, and no absolute path of the
exporting machine (a setting that holds one shows it relative to the workspace, or by its last
component). Issue 28: the answer formats the model was trained in (thinking, direct) and how a request
asks for each (`chat_template_kwargs: {"enable_thinking": ...}`, as for Qwen3). Facts come from the
store (sources, pools, `stage_runs`, `checkpoints`) and the config in effect; rendering is a pure
function of them, so a test reads the card against the store it came from.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import yaml

from pipeline.evaluation.report import markdown_table

# Stages whose run shapes the exported model, in DAG order; their settings go into the card.
LINEAGE_STAGES = ("ingest", "filter", "score", "split", "cpt", "sft", "rl")


@dataclass
class CardFacts:
    model_name: str
    source_checkpoint: str
    source_stage: str
    prompt_format: str
    thinking: bool
    context_length: int
    base_model: str | None  # a Hub id, or None (tiny offline model, local folder)
    license: str
    license_source: str
    example_request: dict[str, Any]  # a complete chat-completions body in the model's format
    sources: list[dict[str, Any]] = field(default_factory=list)
    pools: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)  # stage, fingerprint, finished, summary, settings
    evaluation: list[dict[str, Any]] = field(default_factory=list)  # pipeline/evaluation/report.py's rows
    chosen_by: str = ""  # why this checkpoint was shipped (pipeline/serving/export_choice.py), in words
    fidelity: dict[str, Any] | None = None  # the checkpoint's newest `simulacra fidelity` numbers (`collect_fidelity`)


def collect_pools(store) -> list[dict[str, Any]]:
    """Kept trajectories and turns per domain and pool (the split the training stages drew from)."""
    return store.rows(
        """SELECT t.domain, s.pool, count(DISTINCT t.trajectory_id) AS trajectories, count(u.turn_index) AS turns
           FROM kept_trajectories t JOIN splits s USING (trajectory_id)
           LEFT JOIN kept_turns u USING (trajectory_id)
           GROUP BY ALL ORDER BY t.domain, s.pool"""
    )


def collect_sources(store) -> list[dict[str, Any]]:
    return store.rows(
        "SELECT source, format, count(*) AS trajectories FROM trajectories GROUP BY ALL ORDER BY source, format"
    )


def collect_stages(config, store) -> list[dict[str, Any]]:
    """The latest completed run of each lineage stage, with the config section it ran under: as the run recorded
    it (a training run's `fingerprint.json`), else the config's where the config would reuse that very run (its
    fingerprint is the run's), else none, said so. The config's alone quoted `cpt.learning_rate: 0.5` and
    `max_steps: 999` for a run of 2 steps at 1e-4, an export run with other settings than the training."""
    stages = []
    for stage in LINEAGE_STAGES:
        rows = store.rows(
            "SELECT fingerprint, finished_at, summary, output_path FROM stage_runs WHERE stage = ? "
            "AND status = 'completed' ORDER BY finished_at DESC LIMIT 1",
            [stage],
        )
        if not rows:
            continue
        run = rows[0]
        settings = _recorded_settings(stage, run["output_path"], run["fingerprint"])
        if settings is None and _current_fingerprint(config, store, stage) == run["fingerprint"]:
            settings = config.model_dump(mode="json", include={stage, "model"})
        shown: dict[str, Any] | None = None
        if settings is not None:
            shown = dict(settings[stage])
            if stage == "cpt":  # the base model the training stages start from
                shown["model"] = settings.get("model", config.model.model_dump(mode="json"))
            shown = portable(shown, str(config.workspace.root))
        stages.append(
            {"stage": stage, **{k: run[k] for k in ("fingerprint", "finished_at", "summary")}, "settings": shown}
        )
    return stages


def _current_fingerprint(config, store, stage: str) -> str | None:
    """The stage's fingerprint under the config as it is, or None where it cannot be measured now (a source moved
    since it was ingested): the card then quotes no settings it cannot vouch for, and the export goes on."""
    from pipeline.errors import interrupted
    from pipeline.orchestration.fingerprint import stage_fingerprint

    try:
        return stage_fingerprint(config, store, stage)
    except Exception as exc:  # any probe's failure means only "not verifiable"; the export is not its to fail
        if interrupted(exc):  # ctrl-C during a store query reaches here as DuckDB's error (pipeline/errors.py)
            raise
        return None


def _recorded_settings(stage: str, output_path: str | None, fingerprint: str) -> dict[str, Any] | None:
    """The sections a training run recorded beside its model (pipeline/training/runs.py), if it did."""
    if not output_path:
        return None
    recorded = Path(output_path).parent / "fingerprint.json"
    try:
        written = json.loads(recorded.read_text())
    except (OSError, ValueError):
        return None
    settings = written.get("settings") if written.get("fingerprint") == fingerprint else None
    return settings if isinstance(settings, dict) and isinstance(settings.get(stage), dict) else None


def collect_fidelity(store, checkpoint_id: str) -> dict[str, Any] | None:
    """The checkpoint's numbers from its newest fidelity report (stages/fidelity.py `Headline`, with the model,
    the judge and the date); None where no fidelity run measured it."""
    rows = store.rows(
        "SELECT model, judge, headline, created_at FROM fidelity_reports WHERE checkpoint_id = ? "
        "ORDER BY created_at DESC, report_id LIMIT 1",
        [checkpoint_id],
    )
    if not rows:
        return None
    row = rows[0]
    return {**json.loads(row["headline"]), "model": row["model"], "judge": row["judge"], "measured": row["created_at"]}


def _is_absolute_path(text: str) -> bool:
    return text.startswith(("/", "~")) or PureWindowsPath(text).is_absolute()


def portable(value: Any, workspace_root: str) -> Any:
    """`value` (settings, as JSON) with every absolute path made meaningful elsewhere: relative to the
    workspace (`<workspace>/runs/...`) when under it, else its last component (`<local>/name`)."""
    if isinstance(value, dict):
        return {key: portable(item, workspace_root) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item, workspace_root) for item in value]
    if isinstance(value, str) and _is_absolute_path(value):
        root = workspace_root.rstrip("/")
        if value == root or value.startswith(root + "/"):
            return "<workspace>" + value[len(root) :]
        return f"<local>/{PurePosixPath(value).name}"
    return value


def _front_matter(facts: CardFacts) -> str:
    meta: dict[str, Any] = {"license": facts.license}
    if facts.base_model:
        meta["base_model"] = facts.base_model
    meta.update(
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=[
            "world-model",
            "simulacra",
            "agent-environment-simulator",
            "chatml",
            *sorted({row["domain"] for row in facts.pools}),
        ],
    )
    datasets = sorted({row["source"] for row in facts.sources})
    if datasets:
        meta["datasets"] = datasets
    results = _model_index_results(facts)
    if results:
        meta["model-index"] = [{"name": facts.model_name, "results": results}]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def _model_index_results(facts: CardFacts) -> list[dict[str, Any]]:
    """The exported checkpoint's own rows of the evaluation table, one result per domain (Hub model-index)."""
    own = [row for row in facts.evaluation if row.get("checkpoint_id") == facts.source_checkpoint]
    results = []
    for row in own:
        metrics = [{"type": "agentworldbench_score", "name": "score (0-100)", "value": round(float(row["score"]), 2)}]
        for key in ("observation_ce", "semantic_match", "rouge_l", "exact_match"):
            if row.get(key) is not None:
                metrics.append({"type": key, "name": key.replace("_", " "), "value": round(float(row[key]), 4)})
        results.append(
            {
                "task": {"type": "text-generation", "name": "world-model observation prediction"},
                "dataset": {"type": "simulacra-eval", "name": _dataset_name(row)},
                "metrics": metrics,
            }
        )
    return results


def _dataset_name(row: dict[str, Any]) -> str:
    """The eval set a result is on: a domain's row is its targets of the set, which the set's own description
    ("eval pool, 30 target turns (6 seen in training)") followed by "(mcp)" misstated for mcp's 2."""
    if row["domain"] == "all" or row.get("queries") is None:
        return f"{row['eval_set']} ({row['domain']})"
    return f"{row['eval_set']}: its {row['queries']} {row['domain']} target turns"


# The card's example: a small terminal trajectory, the same for every export so a reader can compare cards.
EXAMPLE_DOMAIN = "terminal"
EXAMPLE_SYSTEM: dict[str, Any] = {
    "task_description": "Count the lines of notes.txt.",
    "action_space": "bash commands, one per action",
    "initial_state": "~/notes.txt holds three lines.",
}
EXAMPLE_TURNS = (("ls", "notes.txt"),)
EXAMPLE_ACTION = "wc -l notes.txt"


def example_request(fmt, model_name: str, max_tokens: int) -> dict[str, Any]:
    """A complete chat-completions body for the example trajectory: the system prompt as its named parts
    (the exported chat template renders them in the model's format, `fmt`), the history, the action, and
    the answer format asked for (the trained one) as vLLM and `simulacra serve` take it."""
    from pipeline.serving.prompt_formats import part_messages
    from pipeline.store.schema import SystemPrompt

    messages = part_messages(EXAMPLE_DOMAIN, SystemPrompt(**EXAMPLE_SYSTEM))
    for action, observation in EXAMPLE_TURNS:
        messages += [{"role": "user", "content": action}, {"role": "assistant", "content": observation}]
    messages.append({"role": "user", "content": EXAMPLE_ACTION})
    return {
        "model": model_name,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": fmt.thinking},
    }


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)\n"
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[key]) for key in header) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


# How each answer format reads and is asked for (SPEC.md, Stage 2: the model is hybrid, as Qwen3's are).
ANSWER_FORMAT_TEXT = {
    "direct": "`direct`: the observation alone, the whole answer in `content`; ask with "
    '`"chat_template_kwargs": {"enable_thinking": false}`.',
    "thinking": "`thinking`: `<think>...</think>`, then the observation; `simulacra serve` (and vLLM with "
    "`--reasoning-parser qwen3`) returns the thinking in `reasoning_content` and the observation alone as "
    '`content`; ask with `"chat_template_kwargs": {"enable_thinking": true}`.',
}


def _answer_formats(facts: CardFacts) -> str:
    from pipeline.serving.prompt_formats import ANSWER_FORMAT_NAMES, prompt_format

    trained = prompt_format(facts.prompt_format, facts.thinking).answer_formats
    default = ANSWER_FORMAT_NAMES[facts.thinking]
    lines = [
        f"- Answer formats it was trained in: {', '.join(f'`{name}`' for name in trained)}; a request that "
        f"does not say gets `{default}`."
    ]
    lines += [f"  - {ANSWER_FORMAT_TEXT[name]}" for name in trained]
    untrained = [name for name in ANSWER_FORMAT_TEXT if name not in trained]
    if untrained:
        lines.append(
            f"  - {', '.join(f'`{name}`' for name in untrained)}: not trained, so refused: a 400 naming the "
            "trained formats from `simulacra serve`, the chat template's error from any other server."
        )
    return "\n".join(lines)


def _steps(median: int | None, followed: int) -> str:
    return (
        f"more than {followed} (fewer than half diverged within the {followed} steps followed)"
        if median is None
        else str(median)
    )


def _fidelity(numbers: dict[str, Any]) -> str:
    """The checkpoint's closed-loop fidelity and policy agreement, in words (issue 31)."""
    lines = [
        "## Fidelity\n",
        f"Measured by `simulacra fidelity` on {str(numbers['measured'])[:10]} (judge `{numbers['judge']}`, "
        f"{numbers['trajectories']} held-out trajectories, scores 0-100):",
        f"- Steps to the first divergence (the first step scoring below {numbers['threshold']:g}), Kaplan-Meier "
        f"median: {_steps(numbers['median_closed'], numbers['followed_closed'])} in closed loop, the model's own "
        f"answers as its history, as an agent in the simulator meets it; "
        f"{_steps(numbers['median_open'], numbers['followed_open'])} in open loop, the real history.",
    ]
    gap = numbers["gap"]
    if numbers["step"] is not None and numbers["closed"] is not None and numbers["open"] is not None:
        interval = "" if gap["low"] is None else f" [{gap['low']:+.1f}, {gap['high']:+.1f}]"
        lines.append(
            f"- At step {numbers['step']} (the last step half the trajectories reach): closed loop "
            f"{numbers['closed']:.1f}, open loop {numbers['open']:.1f}; closed - open {gap['mean']:+.1f}{interval} "
            f"(paired on the trajectories, 95% interval): what compounding errors cost there."
        )
    if numbers["environments"]:
        tau = (
            f"{numbers['kendall_tau']:+.2f}"
            if numbers["kendall_tau"] is not None
            else f"undefined ({numbers['tau_why']})"
        )
        lines.append(
            f"- Policy agreement: Kendall's tau-b {tau} between the success rates of {numbers['policies']} scripted "
            f"policies (a solver, the solver with random slips, a random policy) in this simulator and in the real "
            f"environments ({', '.join(numbers['environments'])}): 1 ranks them as reality does."
        )
    return "\n".join(lines) + "\n"


def render_card(facts: CardFacts) -> str:
    base = (
        f"base model `{facts.base_model}`"
        if facts.base_model
        else "base model: the tiny offline model or a local folder"
    )
    parts = [
        _front_matter(facts),
        f"# {facts.model_name}\n",
        "A language world model of agent environments: given the system prompt of an environment (task, action "
        "space, initial state, demonstrations, simulation instructions), the agent's history and its next action, "
        "it predicts the observation the environment returns. Trained by Simulacra (continual pretraining, "
        "rejection-sampled SFT, GSPO RL).\n",
        "## Using it\n",
        f"- Exported from checkpoint `{facts.source_checkpoint}` (stage `{facts.source_stage}`), {base}; "
        f"trained at {facts.context_length} tokens, the context length servers should allow. Licence "
        f"`{facts.license}` ({facts.license_source}).",
        f"- Why this checkpoint: {facts.chosen_by}." if facts.chosen_by else "",
        f"- Prompt format `{facts.prompt_format}`: the system prompt is sent as its parts (example below) or "
        "already rendered by `pipeline/serving/prompt_formats.py`; user messages are actions, assistant messages "
        "observations. "
        "The chat template (`chat_template.jinja`, read with the tokenizer) lays them out as in training, and `generation_config.json` "
        "stops at `<|im_end|>`, where observations end.",
        _answer_formats(facts),
        "- Serve it with `simulacra serve DIR` (CPU, or vLLM on GPUs with `--engine vllm`) or "
        f"`vllm serve DIR --max-model-len {facts.context_length} --served-model-name {facts.model_name}` (the "
        "name the example request gives); drive it with "
        "`pipeline.serving.environment.WorldModelEnvironment` or the gymnasium / TRL environments of "
        "`pipeline.serving`, or serve it to OpenEnv clients with `simulacra openenv --world-model URL --domain D` "
        "(the `openenv` extra).\n",
        "### Example request\n",
        "A complete `POST /v1/chat/completions` body for a server that applies the exported chat template with the "
        "messages' `name` (`simulacra serve`, vLLM; `transformers serve` drops it: send it the system prompt "
        "rendered): the "
        "system prompt's parts as system messages named for them (`domain`, `task_description`, `action_space`, "
        "`initial_state`, `demonstrations`, `simulation_instructions`; tools in the request's `tools`), which the "
        "template renders in the prompt format the model was trained on; each user message an action, each "
        "assistant message the observation it got; `chat_template_kwargs` the answer format. The model answers "
        "the last action's observation.\n",
        "```json\n" + json.dumps(facts.example_request, indent=2, ensure_ascii=False) + "\n```\n",
        "## Training data\n",
        "### Sources\n",
        _table(facts.sources),
        "### Kept trajectories and turns per domain and pool\n",
        _table(facts.pools),
        "## Stages\n",
    ]
    for stage in facts.stages:
        parts.append(f"### {stage['stage']}\n")
        parts.append(f"- fingerprint `{stage['fingerprint']}`, finished {stage['finished_at']}")
        if stage.get("summary"):
            parts.append(f"- {stage['summary']}")
        if stage["settings"] is None:
            parts.append(
                "- settings: not recorded with the run, and the config's have changed since (its fingerprint names "
                "them); rerun the stage to record them\n"
            )
        else:
            parts.append("\n```yaml\n" + yaml.safe_dump(stage["settings"], sort_keys=True).rstrip() + "\n```\n")
    parts.append("## Evaluation\n")
    parts.append(markdown_table(facts.evaluation) + "\n")
    if facts.fidelity is not None:
        parts.append(_fidelity(facts.fidelity))
    return "\n".join(parts)
