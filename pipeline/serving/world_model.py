"""An exported world model loaded for serving: its metadata, tokenizer, weights and prompt tokens.

Decoding is pipeline/llm/batching.py's (continuous batching on one device). For GPUs, `simulacra
serve --engine vllm` runs the same folder on vLLM (pipeline/serving/vllm_engine.py).
"""

from pathlib import Path

from pipeline.llm.devices import resolve_device
from pipeline.llm.packed_attention import use_packed_attention
from pipeline.serving.chatml import PromptTokens
from pipeline.serving.export_folder import read_metadata
from pipeline.serving.prompt_formats import prompt_format


class WorldModel:
    def __init__(self, model_dir: Path, device: str = "auto"):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar; the server prints one line when it is ready
        self.model_dir = Path(model_dir).resolve()
        self.metadata = read_metadata(self.model_dir)
        self.name: str = self.metadata["model_name"]
        self.format = prompt_format(self.metadata["prompt_format"], self.metadata.get("thinking"))
        self.context_length: int = self.metadata["context_length"]
        self.stop_token_ids: list[int] = self.metadata["stop_token_ids"]
        device = resolve_device(device, "--device")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = use_packed_attention(AutoModelForCausalLM.from_pretrained(self.model_dir).to(device).eval())
        self._prompt_tokens = PromptTokens(self.tokenizer, self.format.thinking)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt's tokens, as training builds them (pipeline/serving/chatml.py): the chat template's
        layout, with special-token text inside content encoded as text."""
        return self._prompt_tokens.ids(messages)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)
