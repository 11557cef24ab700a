"""A token's raw bytes, for the `bytes` of an OpenAI logprob entry.

OpenAI's protocol gives each token's UTF-8 bytes so that a client can join them back into the text where one
character spans several tokens (`🚀` is three tokens of SmolLM2's byte-level BPE). Decoding such a token alone
gives U+FFFD, and the bytes of that are not the token's: the answer `🚀🚀` came back as six `[239, 191, 189]`
(found by probing). Where the decoded text is whole, its UTF-8 is the token's bytes; where it is not, the bytes
come from the token's own piece: byte-level BPE writes each byte as one printable character (GPT-2's alphabet,
inverted here), and a SentencePiece byte fallback names it `<0xNN>`.
"""

import re

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's character for each byte, inverted: printable Latin-1 bytes stand for themselves, the
    other 68 are written as the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = {byte: byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in characters:
            characters[byte] = 256 + shifted
            shifted += 1
    return {chr(character): byte for byte, character in characters.items()}


BYTE_LEVEL = _byte_level_alphabet()


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


def token_bytes(tokenizer, token_id: int, text: str) -> bytes:
    """The bytes of token `token_id`, whose decoded text alone is `text`."""
    if "\ufffd" not in text:
        return text.encode("utf-8")
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str):
        if match := _BYTE_FALLBACK.fullmatch(piece):
            return bytes([int(match[1], 16)])
        if _is_byte_level(tokenizer) and all(character in BYTE_LEVEL for character in piece):
            return bytes(BYTE_LEVEL[character] for character in piece)
    return text.encode("utf-8")
