"""An exported world model loaded for serving: prompt tokens, the context check, generation.

One `generate` at a time (a lock): the device is the bottleneck, and a second call would only
queue inside torch. For throughput, `vllm serve` the exported folder (README, "Serving"); this is
the path that needs nothing but the project, on CPU or one GPU.
"""

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.serving.chatml import PromptTokens
from pipeline.serving.export_folder import read_metadata
from pipeline.serving.prompt_formats import prompt_format


@dataclass(frozen=True, slots=True)
class Generation:
    text: str
    completion_tokens: int
    finish_reason: str  # "stop" at an end token, "length" at the token limit


class WorldModel:
    def __init__(self, model_dir: Path, device: str = "auto"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar; the server prints one line when it is ready
        self.model_dir = Path(model_dir).resolve()
        self.metadata = read_metadata(self.model_dir)
        self.name: str = self.metadata["model_name"]
        self.format = prompt_format(self.metadata["prompt_format"])
        self.context_length: int = self.metadata["context_length"]
        self.stop_token_ids: list[int] = self.metadata["stop_token_ids"]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir).to(device).eval()
        self._prompt_tokens = PromptTokens(self.tokenizer, self.format.thinking)
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt's tokens, as training builds them (pipeline/serving/chatml.py): the chat template's
        layout, with special-token text inside content encoded as text."""
        return self._prompt_tokens.ids(messages)

    def generate(self, prompt: list[int], max_tokens: int, temperature: float | None, top_p: float | None,
                 seed: int | None) -> Generation:
        import torch

        sampling: dict[str, Any] = {"do_sample": bool(temperature)}
        if sampling["do_sample"]:
            sampling.update(temperature=temperature, top_p=top_p if top_p is not None else 1.0)
        with self._lock, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            ids = torch.tensor([prompt], device=self.model.device)
            output = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                eos_token_id=self.stop_token_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                **sampling,
            )
        generated = output[0, len(prompt) :].tolist()
        end = next((i for i, token in enumerate(generated) if token in self.stop_token_ids), None)
        tokens = generated if end is None else generated[:end]
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return Generation(text, len(generated), "length" if end is None else "stop")
