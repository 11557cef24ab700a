"""The prompt tokens of a world-model conversation, built exactly as the training stages build theirs
(issue 17, item 17).

Training tokenises each piece on its own (role header, content, end of turn) and joins the ids, with
literal special-token text inside content encoded as plain text (pipeline/training/sequences.py,
`SequenceBuilder.encode`). Rendering the chat template to one string and tokenising that string
would instead turn a literal `<|im_end|>` inside an action into the special token, ending the
action early for the model: a prompt no training sequence ever looked like. So the server builds the
ids piece by piece with the training builder itself, and applies the chat template's one content
rewrite (a history observation loses its thinking) in Python, the same rule as the template.
"""

from collections.abc import Sequence

from pipeline.llm.thinking_format import THINK_CLOSE


def history_observation(content: str) -> str:
    """An assistant message of the history as the thinking format's chat template renders it: what
    follows the last `</think>`, less up to two newlines (pipeline/serving/chat_template.py)."""
    if THINK_CLOSE not in content:
        return content
    content = content.split(THINK_CLOSE)[-1]
    for separator in ("\n\n", "\n"):
        if content.startswith(separator):
            return content[len(separator) :]
    return content


class PromptTokens:
    """Builds prompt ids from `system` / `user` / `assistant` messages with training's headers, footer
    and content encoding (the messages are already normalised: pipeline/serving/protocol.py)."""

    def __init__(self, tokenizer, thinking: bool):
        from pipeline.training.sequences import SequenceBuilder

        # max_length and seed only matter for training windows and masks, which a prompt has none of.
        self.builder = SequenceBuilder(tokenizer, max_length=1 << 30, seed=0)
        self.thinking = thinking

    def ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        builder = self.builder
        contents = [
            history_observation(m["content"]) if self.thinking and m["role"] == "assistant" else m["content"]
            for m in messages
        ]
        encoded = builder.encode(contents)
        ids: list[int] = []
        for message, content_ids in zip(messages, encoded):
            ids += builder.headers[message["role"]] + content_ids + builder.footer
        return ids + builder.headers["assistant"]
