"""How a model is asked and how its answer is read: a stage's template and the thinking or direct format.

The world model is hybrid (SPEC.md, Stage 2; issue 28), as Qwen3 models are with `enable_thinking`:
- thinking: `<think>\\n{reasoning}\\n</think>\\n\\n{observation}`, parsed strictly
  (pipeline/sft/candidates.py `parse_candidate`);
- direct: the observation alone, as CPT trains it (`parse_direct`: any text, unless it carries a
  thinking tag, which a direct answer never should).
Each training stage asks in its own template family (CPT's fixed one, SFT template 0, RL's fixed
one), and `answers.thinking` chooses the format for SFT and RL; CPT and the base model are always
direct. The format a checkpoint was trained in is written beside its weights (`answer_format.json`),
so evaluation, export and serving ask it as it learned, whatever the configuration says now.

The names are what `evaluations.prompt_format` records: `non-thinking` (CPT's template), `thinking`
and `direct` (SFT template 0), `rl-thinking` and `rl-direct` (RL's template).
"""

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.prompts.rl import rl_system_prompt
from pipeline.prompts.sft import TEMPLATES
from pipeline.sft.candidates import ParsedCandidate, parse_candidate, parse_direct
from pipeline.store.schema import SystemPrompt

FORMAT_FILE = "answer_format.json"
# An exported folder's record (pipeline/serving/export_folder.py writes it): its prompt and answer formats among it.
EXPORT_RECORD = "simulacra.json"


@dataclass(frozen=True, slots=True)
class AnswerFormat:
    name: str
    template: str  # cpt, sft or rl: the stage whose prompt family asks
    thinking: bool

    def system_prompt(self, domain: str, system: SystemPrompt, control_instruction: str | None = None) -> str:
        if self.template == "sft":
            return TEMPLATES[0].render(domain, system, self.thinking)
        if self.template == "rl":
            return rl_system_prompt(domain, system, control_instruction, self.thinking)
        return render_cpt_system_prompt(domain, system)

    def parse(self, text: str | None) -> ParsedCandidate:
        return parse_candidate(text) if self.thinking else parse_direct(text)


NON_THINKING = AnswerFormat("non-thinking", "cpt", False)
SFT_THINKING = AnswerFormat("thinking", "sft", True)
SFT_DIRECT = AnswerFormat("direct", "sft", False)
RL_THINKING = AnswerFormat("rl-thinking", "rl", True)
RL_DIRECT = AnswerFormat("rl-direct", "rl", False)
FORMATS = {f.name: f for f in (NON_THINKING, SFT_THINKING, SFT_DIRECT, RL_THINKING, RL_DIRECT)}


def answer_format(name: str) -> AnswerFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown answer format {name!r}; formats are {', '.join(FORMATS)}")
    return FORMATS[name]


def stage_format(stage: str, thinking: bool) -> AnswerFormat:
    """The format a stage trains (and its model is asked) in: base and cpt direct in CPT's template; sft and
    rl in their own template, thinking or direct."""
    if stage == "sft":
        return SFT_THINKING if thinking else SFT_DIRECT
    if stage == "rl":
        return RL_THINKING if thinking else RL_DIRECT
    return NON_THINKING


def write_model_format(model_dir: Path, fmt: AnswerFormat) -> None:
    """Beside the weights: the format this checkpoint was trained in (read by `model_format`)."""
    (Path(model_dir) / FORMAT_FILE).write_text(
        json.dumps({"format": fmt.name, "template": fmt.template, "thinking": fmt.thinking}) + "\n"
    )


def recorded_format(model_dir: str | Path) -> AnswerFormat | None:
    """The format a model folder records: a checkpoint's `answer_format.json`, else an exported folder's
    `simulacra.json` (its prompt format and whether it answers thinking); None for a folder that records neither.
    An export given to `evaluate --checkpoint` was asked in the direct format whatever it had been trained in, and
    `export.checkpoint=<an export>` asked for export.prompt_format."""
    path = Path(model_dir) / FORMAT_FILE
    if path.is_file():
        return answer_format(json.loads(path.read_text())["format"])
    try:
        record = json.loads((Path(model_dir) / EXPORT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, or not JSON: the export's own reader says which (export_folder.py)
        return None
    if isinstance(record, dict) and record.get("prompt_format") in ("cpt", "sft", "rl"):
        return stage_format(record["prompt_format"], bool(record.get("thinking")))
    return None


def model_format(model_dir: str | Path | None, stage: str | None) -> AnswerFormat:
    """The format a model folder records (`recorded_format`); else the stage's format before the project was hybrid
    (sft and rl trained thinking, everything else direct)."""
    recorded = recorded_format(model_dir) if model_dir is not None else None
    return recorded or stage_format(stage or "base", thinking=stage in ("sft", "rl"))
