"""Helpers of the MiMo-V2-Flash chat tests: the template (tests/data/mimo-v2-flash.jinja, its sources in its header),
tools, and MiMo's tool-call markup as the model writes it."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from chat_support import GET_TIME  # noqa: F401 - the MiMo tests' tool, shared with the other chat tests

DATA = Path(__file__).resolve().parents[1] / "data"
MIMO_TEMPLATE = DATA / "mimo-v2-flash.jinja"
DEFAULT_SYSTEM = "You are MiMo, a helpful AI assistant engineered by Xiaomi."

RUN = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a shell command, with a timeout in seconds",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}


@cache
def mimo_template() -> str:
    return MIMO_TEMPLATE.read_text(encoding="utf-8")


def call(name: str, **args: object) -> str:
    """One call in MiMo's markup: each value on its tag's line, as the template renders history."""
    params = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _synth_models():
    import sys

    tools = str(Path(__file__).resolve().parents[2] / "tools")
    sys.path.insert(0, tools)
    try:
        import synth_models
    finally:
        sys.path.remove(tools)
    return synth_models


def write_mimo_chat_gguf(directory: Path, tokenizer_from: Path) -> Path:
    """The tiny MiMo-shaped model (arch mimo2, random weights) carrying the template as tokenizer.chat_template,
    MiMo's chat markup single tokens of its vocabulary (tools/synth_models.py)."""
    return _synth_models().write_mimo_like(
        directory / "mimo-chat.gguf",
        preset="tiny",
        tokenizer_from=tokenizer_from,
        seed=7,
        chat_template=mimo_template(),
    )


def token_ids(gguf_path: Path) -> dict[str, int]:
    """The ids of MiMo's markup tokens and of the end-of-generation token ("eos") in a GGUF's vocabulary."""
    kv = _synth_models().read_tokenizer_kv(gguf_path)
    tokens = list(kv["tokenizer.ggml.tokens"].value)
    ids = {t: tokens.index(t) for t in _synth_models().MIMO_CHAT_TOKENS}
    return {**ids, "eos": int(kv["tokenizer.ggml.eos_token_id"].value)}
