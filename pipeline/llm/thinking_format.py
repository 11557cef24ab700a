"""The thinking format of every answer the project trains or serves (Qwen3's convention):
`<think>\n{thinking}\n</think>\n\n{observation}`. Here, below the stages that write it (SFT samples,
RL completions) and the code that reads it (the LLM backends, the server, evaluation), so none of
them imports another for two tags; the strict parse of a candidate is SFT's (pipeline/sft/candidates.py).
"""

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def render_thinking_output(thinking: str, observation: str) -> str:
    """The assistant output a thinking sample trains on; pipeline/sft/candidates.py's `parse_candidate` reads it back."""
    return f"{THINK_OPEN}\n{thinking}\n{THINK_CLOSE}\n\n{observation}"
