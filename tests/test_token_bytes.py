"""A logprob entry's `bytes` are the token's own, so a client can join a character split across tokens (found by
probing: `🚀🚀` came back as six U+FFFD's bytes)."""

from pipeline.config.model import TinyModelConfig
from pipeline.serving.token_bytes import BYTE_LEVEL, token_bytes
from pipeline.training.tiny_model import train_tokenizer


def test_the_byte_level_alphabet_covers_every_byte_once():
    assert sorted(BYTE_LEVEL.values()) == list(range(256))
    assert BYTE_LEVEL["Ġ"] == ord(" ") and BYTE_LEVEL["a"] == ord("a")


def test_the_tokens_bytes_join_back_into_the_text_where_their_decoded_texts_do_not():
    tokenizer = train_tokenizer(TinyModelConfig(), ["ls notes.txt\n", "cat a b c\n"] * 50)
    text = "echo '🚀🚀 日本語 ünï' ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    texts = [tokenizer.decode([token], skip_special_tokens=False) for token in ids]
    assert "".join(texts) != text, "some token holds part of a character"
    assert b"".join(token_bytes(tokenizer, token, alone) for token, alone in zip(ids, texts)).decode() == text
