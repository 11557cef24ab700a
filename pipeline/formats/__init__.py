"""Format adapters, by name, in detection order (most specific signature first).

Each adapter is its own small module; `adapter(name)` imports it on first use.
"""

import importlib
from typing import Any

from pipeline.formats.base import FormatAdapter

# name -> module under pipeline.formats that defines `Adapter`. Order is detection order.
ADAPTER_MODULES: dict[str, str] = {
    "simulacra-jsonl": "simulacra_jsonl",
    "agentworldbench": "agentworldbench",
    "atif": "atif",
    "swe-agent": "swe_agent",
    "openhands": "openhands",
    "mini-swe-agent": "mini_swe_agent",
    "openai-chat": "openai_chat",
    "sharegpt": "sharegpt",
    "text-game": "text_game",
    # Never detected: it needs a field mapping from the config, so it is only used when named.
    "generic-jsonl": "generic_jsonl",
}
DETECTABLE = [name for name in ADAPTER_MODULES if name != "generic-jsonl"]

_loaded: dict[str, FormatAdapter] = {}


class UnknownFormat(ValueError):
    pass


def adapter(name: str, **options: Any) -> FormatAdapter:
    if name not in ADAPTER_MODULES:
        raise UnknownFormat(f"unknown format {name!r}; known formats: {', '.join(ADAPTER_MODULES)}")
    if options:
        module = importlib.import_module(f"pipeline.formats.{ADAPTER_MODULES[name]}")
        return module.Adapter(**options)
    if name not in _loaded:
        module = importlib.import_module(f"pipeline.formats.{ADAPTER_MODULES[name]}")
        _loaded[name] = module.Adapter()
    return _loaded[name]


def detect(content: Any) -> FormatAdapter | None:
    """The first adapter whose signature matches a document, or None."""
    for name in DETECTABLE:
        candidate = adapter(name)
        if candidate.detect(content):
            return candidate
    return None
