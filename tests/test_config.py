"""Configuration: defaults with no file, and errors that name the file, the field and the expectation."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import _documented_defaults, app
from pipeline.config import ConfigError, SimulacraConfig, load_config, parse_override

BAD_CONFIGS = [
    # (YAML text, fragments the error must contain)
    ("filter:\n  min_turn: 2\n", ["filter.min_turn", "unknown key"]),
    ("score:\n  keep_ratios:\n    echo: 1.5\n", ["score.keep_ratios.echo", "less than or equal to 1"]),
    ("ingest:\n  batch_trajectories: many\n", ["ingest.batch_trajectories", "valid integer", "'many'"]),
    ("split:\n  ratios:\n    cpt: 0.9\n", ["split.ratios", "sum to 1"]),
    ("score:\n  precedence: [echo, echo]\n", ["score", "precedence must list each"]),
    ("ingest:\n  sources:\n    - path: data/\n", ["ingest.sources.0.name", "required"]),
    ("- just\n- a list\n", ["expected a mapping"]),
    ("filter: [unclosed\n", ["not valid YAML at line 2, column 1: expected ',' or ']'", "at line 1, column 9)"]),
    ("filter:\n  min_turns: 2\n bad: indent\n", ["not valid YAML at line 3, column 2: expected <block end>"]),
    # YAML reads `.inf`, and `gt=0` let it through: CPT trained to NaN weights and registered them.
    ("cpt:\n  learning_rate: .inf\n", ["cpt.learning_rate", "finite number"]),
    ("sft:\n  judge:\n    endpoint:\n      timeout_s: .inf\n", ["sft.judge.endpoint.timeout_s", "finite number"]),
]


@pytest.mark.parametrize("text,fragments", BAD_CONFIGS, ids=[f[0] for _, f in BAD_CONFIGS])
def test_bad_config_names_file_and_field(tmp_path: Path, text: str, fragments: list[str]):
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert "<unicode string>" not in message and "\n" not in message.split("invalid configuration")[0]
    for fragment in fragments:
        assert fragment in message


def test_a_config_file_not_utf8_unreadable_or_a_folder_is_one_line_naming_it(tmp_path: Path):
    """A latin-1 comment, a file the OS cannot read, a folder: each was a traceback (UnicodeDecodeError, OSError)
    or "config file not found" for a folder that is there."""
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("cpt:\n  max_steps: 3  # café\n".encode("latin-1"))
    cases = [
        (latin1, "latin1.yaml: not UTF-8 (byte 0xe9 at offset 26): save it as UTF-8"),
        (tmp_path, f"{tmp_path}: a folder, not a config file"),
    ]
    if Path("/proc/self/mem").exists():  # a file that exists and whose read fails (EIO)
        cases.append((Path("/proc/self/mem"), "/proc/self/mem: could not be read ("))
    for path, expected in cases:
        result = CliRunner().invoke(app, ["--config", str(path), "config"])
        assert result.exit_code == 2, result.output
        assert expected in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("value", ["[", "{a: 1", '"abc', "*alias", "@x", "`x"])
def test_an_override_whose_value_is_not_yaml_names_the_field_and_how_to_quote(value: str):
    """`--set cpt.max_steps=[` was PyYAML's traceback, exit 1; the value itself is not quoted back (an override may
    hold a key)."""
    with pytest.raises(ConfigError) as caught:
        parse_override(f"model.base={value}")
    message = str(caught.value)
    assert message.startswith("override `model.base`: its value is not valid YAML at line 1, column ")
    assert message.endswith("""quote it for a string (--set 'model.base="..."')""")
    result = CliRunner().invoke(app, ["--set", f"model.base={value}", "config"])
    assert result.exit_code == 2 and "override `model.base`" in result.output


def test_no_file_means_defaults_in_the_current_folder():
    config = load_config(None)
    assert config == SimulacraConfig()
    assert config.workspace.root == (Path.cwd() / "simulacra-workspace").resolve()
    assert config.filter.min_turns == 2  # SPEC: drop trajectories with fewer than 2 turns


def test_overrides_apply_on_top_of_the_file(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("cpt:\n  max_steps: 10\n")
    config = load_config(path, [parse_override("cpt.max_steps=3"), parse_override("model.base=Qwen/Qwen3-0.6B")])
    assert config.cpt.max_steps == 3
    assert config.model.base == "Qwen/Qwen3-0.6B"


def test_documented_defaults_round_trip_and_describe_every_field():
    text = _documented_defaults(SimulacraConfig())
    assert SimulacraConfig.model_validate(yaml.safe_load(text)) == SimulacraConfig()
    assert text.count("# ") >= 60


def test_cli_reports_config_error_with_exit_code_2(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("filter:\n  min_turns: -1\n")
    result = CliRunner().invoke(app, ["--config", str(path), "config"])
    assert result.exit_code == 2
    assert "filter.min_turns" in result.output and str(path) in result.output


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[1] / "data" / "configs").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_configs_are_valid(path: Path):
    load_config(path)


CREDENTIAL_CONFIGS = [
    # (YAML text, the field named); the value must appear nowhere in the message
    (
        "sft:\n  judge:\n    endpoint:\n      api_key_env: sk-proj-Q2x9vLm4TtR8wZp1Ys6Kd3Hf\n",
        "sft.judge.endpoint.api_key_env",
    ),
    (
        "rl:\n  reward:\n    judge:\n      endpoint:\n        model: hf_aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3\n",
        "rl.reward.judge.endpoint.model",
    ),
    ("ingest:\n  sources:\n    - name: s\n      path: data/AKIA2E0A8F3B244C9986.jsonl\n", "ingest.sources.0.path"),
    ("cpt:\n  max_stepz: sk-proj-Q2x9vLm4TtR8wZp1Ys6Kd3Hf\n", "cpt.max_stepz"),  # unknown keys too
    # A URL's password (a base_url's is refused by the endpoint's own check, tests/test_llm_secrets.py).
    (
        "ingest:\n  sources:\n    - name: s\n      path: https://u:S3cr3tP4ss@data.example/x.jsonl\n",
        "ingest.sources.0.path",
    ),
]


@pytest.mark.parametrize("text,field", CREDENTIAL_CONFIGS, ids=[f for _, f in CREDENTIAL_CONFIGS])
def test_a_credential_anywhere_in_the_config_is_refused_without_being_shown(tmp_path: Path, text: str, field: str):
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert f"field `{field}`: holds a credential by its shape (" in message and "never goes in the config" in message
    value = yaml.safe_load(text)
    for part in field.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    assert value not in message and value.split("/")[-1].split(".")[0] not in message


def test_a_credential_given_with_set_is_refused_too():
    with pytest.raises(ConfigError) as caught:
        load_config(None, [parse_override("sft.judge.endpoint.api_key_env=sk-proj-Q2x9vLm4TtR8wZp1Ys6Kd3Hf")])
    assert "field `sft.judge.endpoint.api_key_env`" in str(caught.value) and "Q2x9vLm4" not in str(caught.value)
