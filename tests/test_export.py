"""`simulacra export` (issue 12, "The checkpoint"): a real store, the tiny model registered as the
training stages register theirs, the exported folder read back with transformers.

- The folder holds safetensors, the tokenizer with the world-model chat template, a generation
  config that stops at `<|im_end|>`, `simulacra.json` and a model card whose counts are the store's.
- The chat template renders exactly the tokens training built: SFT samples (thinking format) and
  CPT windows (non-thinking), token for token, on real demo trajectories.
- Which checkpoint is exported: the last training stage that ran, or the configured one.
- A rerun is skipped by its fingerprint; the copy to an fsspec URL (a local path, memory://) is whole.
- Issue 28, hybrid thinking: the export takes the answer format the checkpoint was trained in; the chat
  template renders the instruction `enable_thinking` asks for (the training renderer's), refuses a
  format the model was not trained in, and the card says how to ask for each.
"""

import json
import re
import shutil
from pathlib import Path

import fsspec
import pytest

from pipeline.config import load_config
from pipeline.config.model import TinyModelConfig
from pipeline.orchestration.faults import InjectedFault
from pipeline.orchestration.fingerprint import stage_fingerprint
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.prompts.sft import TEMPLATES
from pipeline.serving.chat_template import chat_template
from pipeline.serving.export_source import NothingToExport, resolve_source
from pipeline.serving.prompt_formats import prompt_format, world_model_messages
from pipeline.sft.candidates import render_thinking_output
from pipeline.sft.samples import sft_sequence
from pipeline.store import stage_runs
from pipeline.store.database import Store
from pipeline.store.schema import SystemPrompt
from pipeline.store.snapshot import export_snapshot, read_pool
from pipeline.training.sequences import SequenceBuilder
from pipeline.training.tiny_model import build_tiny_model
from stages import export, ingest, score, split
from stages import filter as filter_stage

REPO = Path(__file__).resolve().parents[1]


def register(store: Store, checkpoint_id: str, stage: str, path: Path, created: str) -> None:
    store.execute(
        "INSERT INTO checkpoints (checkpoint_id, stage, fingerprint, path, base_model, created_at, metrics) "
        "VALUES (?, ?, ?, ?, 'tiny', ?::TIMESTAMP, '{}')",
        [checkpoint_id, stage, checkpoint_id.split("-")[-1], str(path), created],
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The demo's terminal, tool-call and text-game trajectories through the data stages (recorded in stage_runs,
    as the flow records them) and the tiny model registered as a cpt and, later, an sft checkpoint."""
    root = tmp_path_factory.mktemp("export")
    config = load_config(None, [{"workspace": {"path": str(root / "workspace")}}])
    with Store(config.workspace.database_path) as store:
        paths = [str(REPO / "data/demo/terminal.jsonl"), str(REPO / "data/demo/tool_calls.json")]
        stage_runs.execute(store, "ingest", "f-ingest", lambda: ingest.run(config, store, paths=paths))
        ingest.run(config, store, paths=[str(REPO / "data/demo/text_games")], domain="text-game")
        for name, module in (("filter", filter_stage), ("score", score), ("split", split)):
            stage_runs.execute(
                store, name, stage_fingerprint(config, store, name), lambda m=module: m.run(config, store)
            )
        model = build_tiny_model(TinyModelConfig(), [REPO / "data/demo/terminal.jsonl"], root / "tiny")
        register(store, "cpt-aaaa", "cpt", model, "2026-01-01 00:00:00")
        register(store, "sft-bbbb", "sft", model, "2026-01-02 00:00:00")
    return config, root


@pytest.fixture(scope="module")
def exported(workspace):
    config, root = workspace
    config = config.model_copy(update={"export": config.export.model_copy(update={"destination": str(root / "copy")})})
    with Store(config.workspace.database_path) as store:
        result = export.run(config, store)
        rows = store.rows("SELECT * FROM checkpoints WHERE stage = 'export'")
        pools = store.rows(
            "SELECT t.domain, s.pool, count(DISTINCT t.trajectory_id) AS n FROM kept_trajectories t JOIN splits s "
            "USING (trajectory_id) GROUP BY ALL"
        )
    return config, result, rows, pools


def test_export_writes_a_servable_folder(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config, result, rows, pools = exported
    folder = result.output_path
    names = {path.name for path in folder.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "simulacra.json",
        "README.md",
    } <= names
    assert not any(name.endswith((".bin", ".pt")) for name in names)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == chat_template(prompt_format("sft"))
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in GenerationConfig.from_pretrained(folder).eos_token_id
    AutoModelForCausalLM.from_pretrained(folder)
    metadata = json.loads((folder / "simulacra.json").read_text())
    assert (metadata["source_checkpoint"], metadata["prompt_format"], metadata["thinking"]) == ("sft-bbbb", "sft", True)
    # No answer_format.json beside the checkpoint: sft trained thinking, as before the model was hybrid.
    assert (metadata["answer_formats"], metadata["default_answer_format"]) == (["thinking"], "thinking")
    # The length SFT trained at, not the architecture's 4,096 (issue 17, item 17); servers read both.
    assert metadata["context_length"] == config.sft.max_length < TinyModelConfig().max_position_embeddings
    assert tokenizer.model_max_length == config.sft.max_length
    assert metadata["max_history_chars"] == config.sft.max_history_chars
    assert [(row["stage"], row["path"]) for row in rows] == [("export", str(folder))]


def test_no_file_names_a_path_of_the_exporting_machine(exported):
    """Issue 19: the card and simulacra.json carried absolute paths; no file of the folder holds the
    workspace's, the checkpoint's or the home folder's path now."""
    config, result, _, _ = exported
    machine = [str(config.workspace.root), str(Path.home()), str(REPO)]
    for path in result.output_path.iterdir():
        if path.suffix in (".safetensors",):
            continue
        text = path.read_text(encoding="utf-8")
        for root in machine:
            assert root not in text, f"{path.name} names {root}"


def test_model_card_front_matter_follows_the_hub(exported):
    import yaml

    config, result, _, pools = exported
    card = (result.output_path / "README.md").read_text()
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["license"] == "apache-2.0"  # the tiny offline model: built by the project, the project's licence
    assert "base_model" not in meta  # no Hub id to name for a model built here
    assert meta["pipeline_tag"] == "text-generation" and meta["library_name"] == "transformers"
    assert {"world-model", "terminal", "mcp", "text-game"} <= set(meta["tags"])
    assert meta["datasets"] == ["terminal", "text_games", "tool_calls"]
    assert "model-index" not in meta  # not evaluated yet


@pytest.mark.parametrize(
    "base, license_text, expected",
    [
        ("Qwen/Qwen3-0.6B", None, ("Qwen/Qwen3-0.6B", "other")),  # a Hub id whose card is not in the cache
        ("folder", "---\nlicense: llama3.1\ntags: [x]\n---\n# card", (None, "llama3.1")),  # a local base's card
        ("folder", None, (None, "other")),
        # The demo's base: its card said "the tiny offline model or a local folder" and licence "unknown".
        ("smollm2-135m-instruct", None, ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")),
        ("gguf file", None, (None, "apache-2.0")),  # the same model as a file: its GGUF metadata's `general.license`
    ],
)
def test_licence_and_base_model_come_from_the_base_model(config, tmp_path, monkeypatch, base, license_text, expected):
    from pipeline.serving.provenance import provenance
    from pipeline.training.gguf_base import packaged_gguf_file

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    if base == "gguf file":
        base = str(packaged_gguf_file("smollm2-135m-instruct"))
    if base == "folder":
        base = str(tmp_path / "base")
        Path(base).mkdir()
        if license_text:
            (Path(base) / "README.md").write_text(license_text)
    config.model.base = base
    found = provenance(config)
    assert (found.base_model, found.license) == expected
    config.export.license = "mit"
    assert provenance(config).license == "mit"


def test_model_card_reports_sources_pools_stages(exported):
    _, result, _, pools = exported
    card = (result.output_path / "README.md").read_text()
    assert "| terminal | simulacra-jsonl | 120 |" in card and "| tool_calls | openai-chat | 120 |" in card
    assert "| text_games | text-game | 100 |" in card
    for row in pools:
        assert f"| {row['domain']} | {row['pool']} | {row['n']} |" in card
    for stage in ("ingest", "filter", "score", "split"):
        assert f"### {stage}\n" in card
    assert "fingerprint `f-ingest`" in card
    # A fingerprint the config does not give (this one is made up) quotes no settings: the config's may not be the run's.
    ingest_section = card.split("### ingest\n")[1].split("### ")[0]
    assert "settings: not recorded with the run, and the config's have changed since" in ingest_section
    assert "min_turns: 2" in card  # the filter section's settings: the config gives the run's fingerprint
    assert "No evaluation yet (`simulacra evaluate`)." in card
    # The example request names the model as the export does: `vllm serve` must serve it under that name, where
    # it served the folder's path and refused the card's request.
    name = json.loads((result.output_path / "simulacra.json").read_text())["model_name"]
    assert f"--served-model-name {name}`" in card and f'"model": "{name}"' in card


def test_the_card_quotes_the_settings_a_training_run_recorded_not_the_configs_at_export(tmp_path, monkeypatch):
    """`export` with `--set cpt.learning_rate=0.5 --set cpt.max_steps=999` wrote those into the card's cpt section,
    for a run of 2 steps at 1e-4: the card took the sections from the config the export ran under."""
    from pipeline.serving.model_card import collect_stages
    from pipeline.stage import StageResult

    workspace = {"path": str(tmp_path / "workspace")}
    trained = load_config(None, [{"workspace": workspace, "cpt": {"max_steps": 2, "learning_rate": 1e-4}}])
    later = load_config(None, [{"workspace": workspace, "cpt": {"max_steps": 999, "learning_rate": 0.5}}])
    run_dir = tmp_path / "workspace" / "runs" / "cpt" / "fp-cpt"
    (run_dir / "model").mkdir(parents=True)
    settings = {"cpt": trained.cpt.model_dump(mode="json"), "model": trained.model.model_dump(mode="json")}
    (run_dir / "fingerprint.json").write_text(json.dumps({"fingerprint": "fp-cpt", "inputs": {}, "settings": settings}))
    done = StageResult("cpt", metrics={}, output_path=run_dir / "model", summary="2 steps")
    with Store(later.workspace.database_path) as store:
        stage_runs.execute(store, "cpt", "fp-cpt", lambda: done)
        [cpt] = collect_stages(later, store)
        assert (cpt["settings"]["max_steps"], cpt["settings"]["learning_rate"]) == (2, 1e-4)
        # A run from before settings were recorded, whose fingerprint the config no longer gives: none quoted.
        (run_dir / "fingerprint.json").write_text(json.dumps({"fingerprint": "fp-cpt", "inputs": {}}))
        [cpt] = collect_stages(later, store)
        assert cpt["settings"] is None
        # A fingerprint that cannot be measured now (a source moved) is "not recorded"; ctrl-C while measuring it,
        # which DuckDB reports as its own error, still stops the export.
        import pipeline.orchestration.fingerprint as fingerprint

        for raised, stops in ((FileNotFoundError("moved"), False), (RuntimeError("Query interrupted"), True)):

            def unmeasurable(*args, raised=raised):
                raise raised

            monkeypatch.setattr(fingerprint, "stage_fingerprint", unmeasurable)
            if stops:
                with pytest.raises(RuntimeError, match="Query interrupted"):
                    collect_stages(later, store)
            else:
                assert collect_stages(later, store)[0]["settings"] is None


def test_copy_to_destination_is_whole(exported, tmp_path):
    config, result, _, _ = exported
    local = sorted(p.relative_to(result.output_path).as_posix() for p in result.output_path.rglob("*") if p.is_file())
    copied = Path(config.export.destination)
    assert sorted(p.relative_to(copied).as_posix() for p in copied.rglob("*") if p.is_file()) == local
    assert result.metrics["destination"] == str(copied)

    export.copy_to(result.output_path, "memory://simulacra-test/wm")
    memory = fsspec.filesystem("memory")
    found = sorted(path.removeprefix("/simulacra-test/wm/") for path in memory.find("/simulacra-test/wm"))
    assert found == local
    assert memory.cat("/simulacra-test/wm/README.md") == (result.output_path / "README.md").read_bytes()


@pytest.mark.parametrize(
    "destination, refusal",
    [
        ("nosuchscheme://b/wm", "export.destination: nosuchscheme://b/wm: Protocol not known"),
        ("{tmp}/a-file", "export.destination: {tmp}/a-file is a file: name a folder"),
    ],
    ids=["unknown scheme", "a file"],
)
def test_an_unusable_destination_stops_the_stage_before_any_work(exported, tmp_path, destination, refusal):
    config, _, _, _ = exported
    (tmp_path / "a-file").write_text("not a folder")
    destination, refusal = destination.format(tmp=tmp_path), refusal.format(tmp=tmp_path)
    config = config.model_copy(update={"export": config.export.model_copy(update={"destination": destination})})
    with Store(config.workspace.database_path) as store:
        with pytest.raises(ValueError, match=re.escape(refusal)):
            export.run(config, store)
        assert store.execute("SELECT count(*) FROM checkpoints WHERE stage = 'export'").fetchone()[0] == 1
        assert not export.output_dir(config, stage_fingerprint(config, store, "export")).exists()


def test_a_destination_that_refuses_a_file_is_one_line_and_the_rerun_completes_the_copy(exported, tmp_path):
    config, result, _, _ = exported
    destination = tmp_path / "copy"
    (destination / "README.md").mkdir(parents=True)  # where the card goes, a folder: the write fails
    config = config.model_copy(update={"export": config.export.model_copy(update={"destination": str(destination)})})
    with Store(config.workspace.database_path) as store:
        with pytest.raises(ValueError) as refused:
            export.run(config, store)
        assert str(refused.value).startswith(
            f"export.destination: {destination}: writing README.md failed (Is a directory); the export itself is "
            "complete in "
        )
        (destination / "README.md").rmdir()
        again = export.run(config, store)
        # The destination is in the fingerprint: the module's store is left with its one export, as found.
        store.execute("DELETE FROM checkpoints WHERE stage = 'export' AND path = ?", [str(again.output_path)])
    assert again.output_path != result.output_path
    copied = sorted(p.relative_to(destination).as_posix() for p in destination.rglob("*") if p.is_file())
    assert copied == sorted(
        p.relative_to(again.output_path).as_posix() for p in again.output_path.rglob("*") if p.is_file()
    )


def test_rerun_is_skipped_by_fingerprint(exported):
    config, result, _, _ = exported
    with Store(config.workspace.database_path) as store:
        again = export.run(config, store)
        assert store.execute("SELECT count(*) FROM checkpoints WHERE stage = 'export'").fetchone()[0] == 1
    assert again.summary.startswith("already exported")
    assert again.output_path == result.output_path


def test_the_fault_drill_fails_export_after_its_folder_and_the_retry_registers_it_once(exported, tmp_path):
    # Found by probing: `orchestration.fail_stage` did nothing for export (nor score, split: tests/test_flows.py).
    config, result, _, _ = exported
    copy = tmp_path / "workspace"
    shutil.copytree(config.workspace.root, copy)
    drill = config.model_copy(
        update={
            "workspace": config.workspace.model_copy(update={"path": copy}),
            "export": config.export.model_copy(update={"destination": None}),
            "orchestration": config.orchestration.model_copy(update={"fail_stage": "export"}),
        }
    )
    shutil.rmtree(drill.workspace.root / "runs" / "export")
    with Store(drill.workspace.database_path) as store:
        store.execute("DELETE FROM checkpoints WHERE stage = 'export'")
        with pytest.raises(InjectedFault, match="after writing"):
            export.run(drill, store)
        assert store.scalar("SELECT count(*) FROM checkpoints WHERE stage = 'export'") == 0
        again = export.run(drill, store)
        assert store.scalar("SELECT count(*) FROM checkpoints WHERE stage = 'export'") == 1
    assert again.summary.startswith("already exported")


def test_an_evaluation_of_the_checkpoint_reaches_a_new_card(exported):
    """Recording an evaluation of the exported checkpoint changes the export's fingerprint, and the new
    card holds the evaluation table (rows as pipeline/evaluation/report.py reads them)."""
    config, result, _, _ = exported
    with Store(config.workspace.database_path) as store:
        store.execute(
            "INSERT INTO evaluations VALUES ('ev1', 'sft-bbbb', 'sft-bbbb', 'sft', NULL, 'sft', 'bbbb', 'eval pool', "
            "'es1', 'semantic#x', 'j1', 4, true, now(), now())"
        )
        for domain, score in (("terminal", 41.25), ("all", 37.5)):
            store.execute(
                "INSERT INTO eval_results (evaluation_id, domain, queries, judged, score, unparsed, failed, judge_invalid, "
                "observation_ce, perplexity, semantic_match, rouge_l, exact_match, json_references) "
                "VALUES ('ev1', ?, 4, 4, ?, 0, 0, 0, 3.25, 25.8, 0.5, 0.4, 0.25, 0)",
                [domain, score],
            )
        again = export.run(config, store)
    assert again.output_path != result.output_path and again.summary.startswith("exported")
    card = (again.output_path / "README.md").read_text()
    assert "| sft-bbbb | terminal | 4 | 41.2 |" in card and "| sft-bbbb | all | 4 | 37.5 |" in card
    assert "No evaluation yet" not in card
    import yaml

    (index,) = yaml.safe_load(card.split("---\n")[1])["model-index"]
    scores = {r["dataset"]["name"]: r["metrics"][0]["value"] for r in index["results"]}
    # A domain's result is on its own targets of the set: "eval pool (mcp)" read as the whole set's 30 for mcp's 2.
    assert scores == {"eval pool: its 4 terminal target turns": 41.25, "eval pool (all)": 37.5}


def _trajectories(config, tmp_path, pool: str):
    """Every trajectory of the pool (the three demo domains)."""
    with Store(config.workspace.database_path) as store:
        snapshot = export_snapshot(store, tmp_path / "snapshot", (pool,))
    return list(read_pool(snapshot, pool))


def test_chat_template_renders_the_sft_training_tokens(exported, tmp_path):
    """An SFT sample (thinking format) and the exported template's rendering of the same query agree
    token for token: the prompt, and the prompt followed by the training target."""
    from transformers import AutoTokenizer

    config, result, _, _ = exported
    tokenizer = AutoTokenizer.from_pretrained(result.output_path)
    builder = SequenceBuilder(tokenizer, 1 << 20, 0)
    checked = set()
    for trajectory in _trajectories(config, tmp_path, "sft"):
        *history, target = trajectory.turns
        system = TEMPLATES[0].render(trajectory.domain, trajectory.system)
        output = render_thinking_output("The command lists the folder.", target.observation)
        sample = sft_sequence(
            builder, trajectory.trajectory_id, system, history, target.action, output, target.turn_index
        )
        messages = world_model_messages(
            prompt_format("sft"),
            trajectory.domain,
            trajectory.system,
            [(t.action, t.observation) for t in history],
            target.action,
        )
        assert messages[0]["content"] == system
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        labelled = next(i for i, label in enumerate(sample.sequence.labels) if label != -100)
        assert sample.sequence.input_ids[:labelled] == prompt_ids
        full = tokenizer(prompt + output + "<|im_end|>\n", add_special_tokens=False)["input_ids"]
        assert sample.sequence.input_ids == full
        checked.add(trajectory.domain)
    assert checked == {"terminal", "mcp", "text-game"}


def test_chat_template_renders_the_cpt_training_tokens(exported, tmp_path):
    """A CPT window (non-thinking format, whole trajectory) and the template over the same turns agree."""
    from transformers import AutoTokenizer

    config, result, _, _ = exported
    tokenizer = AutoTokenizer.from_pretrained(result.output_path)
    tokenizer.chat_template = chat_template(prompt_format("cpt"))
    builder = SequenceBuilder(tokenizer, 1 << 20, 0)
    checked = set()
    for trajectory in _trajectories(config, tmp_path, "cpt"):
        prompt = render_cpt_system_prompt(trajectory.domain, trajectory.system)
        (window,), _ = builder.trajectory_sequences(
            trajectory.trajectory_id, prompt, trajectory.turns, full_labels=True
        )
        messages = world_model_messages(
            prompt_format("cpt"),
            trajectory.domain,
            trajectory.system,
            [(t.action, t.observation) for t in trajectory.turns[:-1]],
            trajectory.turns[-1].action,
        )
        messages.append({"role": "assistant", "content": trajectory.turns[-1].observation})
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        assert window.input_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        checked.add(trajectory.domain)
    assert checked == {"terminal", "mcp", "text-game"}


@pytest.mark.parametrize(
    "observation",
    [
        "<think>\nit prints the files\n</think>\n\nREADME.md  src",  # what a thinking model writes
        "<think>x</think>\nREADME.md  src",
        "README.md  src",  # already without thinking
    ],
)
def test_history_observations_lose_their_thinking(observation):
    from jinja2 import Template

    messages = [
        {"role": "user", "content": "ls"},
        {"role": "assistant", "content": observation},
        {"role": "user", "content": "pwd"},
    ]
    rendered = Template(chat_template(prompt_format("sft"))).render(messages=messages, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>user\nls<|im_end|>\n<|im_start|>assistant\nREADME.md  src<|im_end|>\n"
        "<|im_start|>user\npwd<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "registered, chosen, expected",
    [
        ([("cpt-1", "cpt")], None, "cpt-1"),
        ([("cpt-1", "cpt"), ("sft-2", "sft")], None, "sft-2"),  # the last training stage that ran
        ([("sft-2", "sft"), ("cpt-3", "cpt")], None, "sft-2"),  # a later cpt does not outrank sft
        ([("cpt-1", "cpt"), ("sft-2", "sft")], "cpt-1", "cpt-1"),  # export.checkpoint by id
        ([], None, NothingToExport),
        ([("cpt-1", "cpt")], "cpt-9", NothingToExport),
    ],
)
def test_which_checkpoint_is_exported(config, store, tmp_path, registered, chosen, expected):
    for day, (checkpoint_id, stage) in enumerate(registered, start=1):
        folder = tmp_path / checkpoint_id
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        register(store, checkpoint_id, stage, folder, f"2026-01-0{day} 00:00:00")
    config.export.checkpoint = chosen
    if expected is NothingToExport:
        with pytest.raises(NothingToExport):
            resolve_source(config, store)
    else:
        assert resolve_source(config, store).checkpoint_id == expected


@pytest.mark.parametrize(
    "stage, recorded, chosen, expected",
    [
        ("sft", None, None, ("sft", True)),  # no record: the stage's format before the model was hybrid
        ("cpt", None, None, ("cpt", False)),
        ("sft", "direct", None, ("sft", False)),  # answer_format.json beside the weights decides
        ("rl", "rl-direct", None, ("rl", False)),
        ("rl", "rl-thinking", None, ("rl", True)),
        ("sft", "direct", "rl", ("rl", False)),  # export.prompt_format names the template, not the answer format
        ("sft", "direct", "cpt", ("cpt", False)),
        ("sft", "thinking", "cpt", "CPT trains no thinking"),
        (None, None, None, "trained in no known prompt format"),  # a folder nothing records
        (None, "rl-direct", None, ("rl", False)),
    ],
)
def test_the_export_takes_the_answer_format_the_checkpoint_was_trained_in(
    config, tmp_path, stage, recorded, chosen, expected
):
    from pipeline.prompts.answer_format import answer_format, write_model_format
    from pipeline.serving.export_source import SourceCheckpoint, resolve_format

    if recorded is not None:
        write_model_format(tmp_path, answer_format(recorded))
    config.export.prompt_format = chosen
    source = SourceCheckpoint("ckpt-1", stage, tmp_path, "tiny")
    if isinstance(expected, str):
        with pytest.raises(NothingToExport, match=expected):
            resolve_format(config, source)
    else:
        fmt = resolve_format(config, source)
        assert (fmt.name, fmt.thinking) == expected


def test_an_exported_folder_exports_again_in_the_format_it_records(exported, tmp_path):
    """`export.checkpoint=<an export>` (to export it with another licence, or somewhere else) asked for
    export.prompt_format: an exported folder records its format in simulacra.json, not answer_format.json."""
    config, result, _, _ = exported
    first = json.loads((result.output_path / "simulacra.json").read_text())
    again = config.model_copy(
        update={
            "workspace": config.workspace.model_copy(update={"path": tmp_path / "again"}),
            "export": config.export.model_copy(update={"checkpoint": str(result.output_path), "destination": None}),
        }
    )
    with Store(again.workspace.database_path) as store:
        second = export.run(again, store)
    metadata = json.loads((second.output_path / "simulacra.json").read_text())
    assert (metadata["prompt_format"], metadata["answer_formats"]) == (first["prompt_format"], first["answer_formats"])


def test_an_exported_folder_is_evaluated_in_the_format_it_was_trained_in(exported):
    """`evaluate --checkpoint <an export>` asked it in the direct format (or in thinking with --thinking), whatever
    the export records: a model trained to think was scored on answers it was never taught to give."""
    from pipeline.prompts.answer_format import stage_format
    from stages.evaluate import named_models

    config, result, _, _ = exported
    record = json.loads((result.output_path / "simulacra.json").read_text())
    trained = stage_format(record["prompt_format"], record["thinking"])
    with Store(config.workspace.database_path) as store:
        for thinking in (False, True):  # the --thinking flag is for folders that record nothing
            [model] = named_models(config, store, [str(result.output_path)], thinking)
            assert model.prompt_format == trained.name
        # Named twice (a trailing slash, a relative path): one model, not two rows of one name.
        assert len(named_models(config, store, [str(result.output_path), f"{result.output_path}/"], False)) == 1


PARTS_SYSTEM = SystemPrompt(
    task_description="Count the lines of notes.txt.",
    action_space="bash commands",
    tools=[{"type": "function", "function": {"name": "wc"}}],
    initial_state="notes.txt",
    simulation_instructions="Paginate long outputs.",
)
THINKING_REFUSED = (
    "enable_thinking=false asks for the direct answer format, which this model was not trained in "
    "(answer formats: thinking)"
)
DIRECT_REFUSED = (
    "enable_thinking=true asks for the thinking answer format, which this model was not trained in "
    "(answer formats: direct)"
)


@pytest.mark.parametrize(
    "name, trained, enable_thinking, expected",
    [
        ("sft", False, None, False),  # not given: the trained format
        ("sft", False, False, False),
        ("sft", False, True, DIRECT_REFUSED),
        ("sft", True, None, True),
        ("sft", True, True, True),
        ("sft", True, False, THINKING_REFUSED),
        ("rl", False, False, False),
        ("rl", False, True, DIRECT_REFUSED),
        ("rl", True, True, True),
        ("rl", True, False, THINKING_REFUSED),
        ("cpt", False, False, False),
        ("cpt", False, True, DIRECT_REFUSED),
        ("sft", False, "yes", "enable_thinking must be true or false"),
    ],
)
def test_enable_thinking_chooses_the_instruction_rendered_from_the_parts(
    tiny_chat_model, name, trained, enable_thinking, expected
):
    """As Qwen3's templates read `enable_thinking`: from part messages the template renders the system prompt
    the training stages' renderer writes in that answer format (SFT template 0, RL's, CPT's); a format the
    model was not trained in raises, naming the trained one."""
    from jinja2.exceptions import TemplateError
    from transformers import AutoTokenizer

    from pipeline.prompts.rl import rl_system_prompt
    from pipeline.serving.prompt_formats import part_messages

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model)
    tokenizer.chat_template = chat_template(prompt_format(name, trained))
    messages = part_messages("terminal", PARTS_SYSTEM) + [{"role": "user", "content": "wc -l notes.txt"}]
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    if isinstance(expected, str):
        with pytest.raises(TemplateError, match=re.escape(expected)):
            tokenizer.apply_chat_template(messages, tools=PARTS_SYSTEM.tools, tokenize=False, **kwargs)
        return
    rendered = tokenizer.apply_chat_template(messages, tools=PARTS_SYSTEM.tools, tokenize=False, **kwargs)
    system = {
        "sft": lambda: TEMPLATES[0].render("terminal", PARTS_SYSTEM, expected),
        "rl": lambda: rl_system_prompt("terminal", PARTS_SYSTEM, None, expected),
        "cpt": lambda: render_cpt_system_prompt("terminal", PARTS_SYSTEM),
    }[name]()
    assert rendered.startswith(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nwc -l notes.txt")
    other = prompt_format(name).layout.instruction_for(not expected)
    assert name == "cpt" or other not in rendered  # the other format's instruction is not there


@pytest.mark.parametrize(
    "thinking, trained, refused", [(False, "`direct`", "`thinking`"), (True, "`thinking`", "`direct`")]
)
def test_the_card_says_which_answer_formats_were_trained_and_how_to_ask(thinking, trained, refused):
    from pipeline.serving.model_card import CardFacts, example_request, render_card

    fmt = prompt_format("sft", thinking)
    card = render_card(
        CardFacts(
            "wm", "sft-1", "sft", "sft", thinking, 512, None, "apache-2.0", "project", example_request(fmt, "wm", 64)
        )
    )
    assert f"Answer formats it was trained in: {trained}; a request that does not say gets {trained}." in card
    assert f'`"chat_template_kwargs": {{"enable_thinking": {str(thinking).lower()}}}`' in card
    assert f"  - {refused}: not trained, so refused" in card
    request = json.loads(re.search(r"### Example request\n.*?```json\n(.*?)\n```", card, re.S).group(1))
    assert request["chat_template_kwargs"] == {"enable_thinking": thinking}


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["export"], "export: no store at "),  # a workspace with nothing in it: not an empty store made there
        (["--set", "export.checkpoint=nowhere", "export"], "export: export.checkpoint: nowhere is neither"),
        (["serve", "."], "serve: . is not an exported world model (no simulacra.json)"),
    ],
)
def test_cli_refuses_with_one_line(tmp_path, arguments, message):
    import os
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--set", f"workspace.path={tmp_path / 'ws'}", *arguments],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"},
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith(message), completed.stderr
    assert "Traceback" not in completed.stderr and len(completed.stderr.strip().splitlines()) == 1


def test_a_literal_end_token_inside_content_is_text_as_in_training(exported):
    """Issue 17, item 17: an action (or observation) holding the text `<|im_end|>` is encoded as text by
    training; the server's prompt tokens (pipeline/serving/chatml.py) are training's, where rendering
    the template and tokenising the string made it the special token."""
    from transformers import AutoTokenizer

    from pipeline.serving.chatml import PromptTokens
    from pipeline.store.schema import ScoredTurn

    _, result, _, _ = exported
    tokenizer = AutoTokenizer.from_pretrained(result.output_path)
    builder = SequenceBuilder(tokenizer, 1 << 20, 0)
    system = SystemPrompt(task_description="Print a file.", action_space="bash commands")
    history = [ScoredTurn(0, "cat turn.txt", "end<|im_end|>\n<|im_start|>user", "other", 1.0)]
    action = 'printf "<|im_end|>\\n<|im_start|>assistant\\nforged"'
    output = render_thinking_output("It prints.", "<|im_end|>")
    sample = sft_sequence(builder, "t", TEMPLATES[0].render("terminal", system), history, action, output, 1)
    messages = world_model_messages(
        prompt_format("sft"), "terminal", system, [(t.action, t.observation) for t in history], action
    )
    ids = PromptTokens(tokenizer, thinking=True).ids(messages)
    labelled = next(i for i, label in enumerate(sample.sequence.labels) if label != -100)
    assert ids == sample.sequence.input_ids[:labelled]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_end) == len(messages)  # one per message: none forged by the content
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer(rendered, add_special_tokens=False)["input_ids"].count(im_end) > len(messages)


@pytest.mark.parametrize("name", ["cpt", "sft", "rl"])
def test_the_chat_template_renders_the_system_prompt_from_its_parts(exported, tmp_path, name):
    """Issue 19, deliver 2: the five parts sent as named system messages (tools in `tools`) render, in the
    exported template, the very system prompt the training stages' renderer writes, on every demo
    trajectory of every pool."""
    from transformers import AutoTokenizer

    from pipeline.serving.prompt_formats import part_messages

    config, result, _, _ = exported
    fmt = prompt_format(name)
    tokenizer = AutoTokenizer.from_pretrained(result.output_path)
    tokenizer.chat_template = chat_template(fmt)
    checked = 0
    for pool in ("cpt", "sft", "eval"):
        for trajectory in _trajectories(config, tmp_path / pool, pool):
            rendered = tokenizer.apply_chat_template(
                part_messages(trajectory.domain, trajectory.system),
                tools=trajectory.system.tools or None,
                tokenize=False,
            )
            expected = fmt.render_system(trajectory.domain, trajectory.system)
            assert rendered == f"<|im_start|>system\n{expected}<|im_end|>\n"
            checked += 1
    assert checked > 100
    # A domain no stage trained on, or none: refused as `simulacra serve` refuses it, where the template rendered
    # "the kitchen domain" (or "the  domain") without a word.
    from jinja2.exceptions import TemplateError

    parts = part_messages("terminal", SystemPrompt("Count the lines."))
    for domain in ("kitchen", None):
        asked = [m for m in parts if m["name"] != "domain"]
        if domain is not None:
            asked = [{"role": "system", "name": "domain", "content": domain}, *asked]
        with pytest.raises(TemplateError, match="the `domain` part is .*, not one of terminal, swe, mcp"):
            tokenizer.apply_chat_template(asked, tokenize=False)


def test_the_cards_example_renders_the_training_tokens(exported):
    """The model card's example request, rendered through the exported template as any server would,
    is token for token the prompt of the SFT sample of the same query."""
    import re

    from transformers import AutoTokenizer

    from pipeline.serving.model_card import EXAMPLE_DOMAIN, EXAMPLE_SYSTEM
    from pipeline.store.schema import ScoredTurn

    _, result, _, _ = exported
    card = (result.output_path / "README.md").read_text()
    request = json.loads(re.search(r"### Example request\n.*?```json\n(.*?)\n```", card, re.S).group(1))
    tokenizer = AutoTokenizer.from_pretrained(result.output_path)
    rendered = tokenizer.apply_chat_template(
        request["messages"], tools=request.get("tools"), tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    system = SystemPrompt(**EXAMPLE_SYSTEM)
    turns = [m["content"] for m in request["messages"] if m["role"] in ("user", "assistant")]
    history = [ScoredTurn(i, a, o, "history", 1.0) for i, (a, o) in enumerate(zip(turns[:-1:2], turns[1::2]))]
    builder = SequenceBuilder(tokenizer, 1 << 20, 0)
    sample = sft_sequence(
        builder,
        "card",
        TEMPLATES[0].render(EXAMPLE_DOMAIN, system),
        history,
        turns[-1],
        "<think>\n.\n</think>\n\n3 notes.txt",
        len(history),
    )
    labelled = next(i for i, label in enumerate(sample.sequence.labels) if label != -100)
    assert ids == sample.sequence.input_ids[:labelled]
    assert any(m.get("name") == "task_description" for m in request["messages"])  # the parts, not a rendered prompt


@pytest.mark.parametrize(
    "scores, expected",
    [
        ({"cpt-1": 30.0, "sft-2": 45.0, "rl-3": 40.0}, ["sft-2"]),  # the best validation score, not the last stage
        ({"cpt-1": None, "sft-2": None, "rl-3": None}, ["rl-3"]),  # no scores: the last training stage that ran
    ],
)
def test_evaluation_of_the_shipped_checkpoint_takes_what_export_ships(config, store, tmp_path, scores, expected):
    """`evaluate.checkpoints: shipped` evaluates the checkpoint `export` would ship (beside base), not each stage's."""
    from stages.evaluate import default_models

    for day, (checkpoint_id, validation) in enumerate(scores.items(), start=1):
        folder = tmp_path / checkpoint_id
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        register(store, checkpoint_id, checkpoint_id.split("-")[0], folder, f"2026-01-0{day} 00:00:00")
        store.execute(
            "UPDATE checkpoints SET metrics = ? WHERE checkpoint_id = ?",
            [json.dumps({} if validation is None else {"val_score_after": validation}), checkpoint_id],
        )
    assert [m.checkpoint_id for m in default_models(config, store)] == ["cpt-1", "sft-2", "rl-3"]  # newest: every stage
    config.evaluate.checkpoints = "shipped"
    assert [m.checkpoint_id for m in default_models(config, store)] == expected
