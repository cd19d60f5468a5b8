"""``llama-vq-tune-attn``: measure (or read from the cache) the choice ``-fa auto`` makes for a model and print the
table of the paths' speeds, for operators who want the first start of a server fast (behind llama-swap, say): run it
once with the server's -m/-c/-ub/-ctk/-ctv. The measuring and the cache are attn_choice.py's.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .attn_choice import (
    MARGIN,
    AttnShape,
    Choice,
    Device,
    _f,
    cache_path,
    choose,
    context_length,
    model_device,
    model_shape,
    tuning_enabled,
)


def table(choice: Choice, device: Device, shape: AttnShape | None, type_k: str, type_v: str) -> str:
    """The operator's table: paths x batch kinds, and the choice."""
    lines = [f"device: {device.name} ({device.description}){', driver ' + device.driver if device.driver else ''}"]
    if shape is not None:
        lines.append(f"shape: {shape.words()}; cache K {type_k} / V {type_v}")
    if choice.timings is not None and choice.key is not None:
        t = choice.timings
        lines.append(f"depth {choice.key['depth']}, ubatch {choice.key['n_ubatch']}")
        lines.append(f"{'path':<18}{'prompt tok/s':>14}{'decode tok/s':>14}")
        lines.append(f"{'flash attention':<18}{_f(t.prompt_flash):>14}{_f(t.decode_flash):>14}")
        lines.append(f"{'llama-vq':<18}{_f(t.prompt_vq):>14}{_f(t.decode_vq):>14}")
    took = f", {choice.seconds:.1f} s" if choice.how == "measured" else ""
    lines.append(f"-fa auto: {choice.mode} ({choice.how}{took}; the other path must win by more than {MARGIN:.0%})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """llama-vq-tune-attn: measure (or read) the choice of -fa auto for a model and print the table."""
    ap = argparse.ArgumentParser(
        prog="llama-vq-tune-attn",
        description="Measure flash attention against llama-vq's attention for a model's attention shape on this "
        "device, cache the choice -fa auto makes, and print the table. Takes llama-vq-server's flags for them.",
    )
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-ctk", "--cache-type-k", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    ap.add_argument("-ub", "--ubatch-size", type=int, default=512)
    ap.add_argument("-c", "--ctx-size", type=int, default=0, help="context size (0: the model's)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--force", action="store_true", help="measure even if the choice is cached")
    args, _unknown = ap.parse_known_args(argv)

    from ._gguf import read_metadata
    from .cache_types import parse_cache_type

    tk = parse_cache_type(args.cache_type_k, param="type_k")
    tv = parse_cache_type(args.cache_type_v, param="type_v")
    n_ctx = args.ctx_size or context_length(read_metadata(args.model))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = model_device()
    if not tuning_enabled():
        print("LLAMA_VQ_ATTN_TUNE=0: measuring is off, -fa auto follows the static rule", file=sys.stderr)
    choice = choose(
        args.model, tk.ggml_type, tv.ggml_type, n_ubatch=args.ubatch_size, n_ctx=n_ctx, n_threads=args.threads,
        force=args.force, device=device,
    )  # fmt: skip
    try:
        shape: AttnShape | None = model_shape(args.model)
    except (OSError, ValueError):
        shape = None
    print(table(choice, device, shape, tk.name, tv.name))
    print(f"cache: {cache_path()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
