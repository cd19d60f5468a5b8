"""What llama.cpp's chat layer (llama_vq.chat) costs per request and per generated piece, on this CPU.

    python benchmarks/chat_cost.py            # prints one table (median of repeats), no model needed

Template init (the autoparser's analysis), apply (render + grammar) with and without tools, and the
streaming parse: every feed re-parses the whole output so far (as llama-server does), so the cost of one
piece grows with the output; the table gives the last piece's cost at 1K, 4K and 16K characters.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from chat_support import GET_TIME, GET_WEATHER, template_text  # noqa: E402

from llama_vq import ChatTemplates  # noqa: E402

TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "MiMo-VL.jinja", "openai-gpt-oss-120b.jinja"]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _ms(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _piece_cost(tmpl: ChatTemplates, plan, chars: int) -> float:
    """ms of the feed that brings a reasoning + content output to `chars` characters."""
    stream = tmpl.stream(plan)
    body = ("<think>\n" + "Let me think about the weather in Paris. " * (chars // 40))[: chars - 8]
    stream.feed(body)
    t0 = time.perf_counter()
    stream.feed("\n</think>\n\nSunny.")
    ms = (time.perf_counter() - t0) * 1000
    stream.finish()
    return ms


def main() -> None:
    print("| template | init ms | apply ms | apply + 2 tools ms | piece @1K / 4K / 16K chars ms |")
    print("|---|---:|---:|---:|---:|")
    for name in TEMPLATES:
        text = template_text(name)
        init = _ms(lambda t=text: ChatTemplates(template=t).close(), repeat=3)
        tmpl = ChatTemplates(template=text)
        plain = _ms(lambda tmpl=tmpl: tmpl.apply({"messages": USER}))
        tools = _ms(lambda tmpl=tmpl: tmpl.apply({"messages": USER, "tools": [GET_TIME, GET_WEATHER]}))
        plan = tmpl.apply({"messages": USER, "reasoning_format": "deepseek"})
        pieces = " / ".join(f"{statistics.median(_piece_cost(tmpl, plan, n) for _ in range(3)):.2f}"
                            for n in (1000, 4000, 16000))
        print(f"| {name} | {init:.1f} | {plain:.2f} | {tools:.2f} | {pieces} |")


if __name__ == "__main__":
    main()
