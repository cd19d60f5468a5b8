"""The one loader of our native libraries (llama_vq/_cdll.py): the chat and server libraries and libggml load
through it with their signatures; a missing library or another ABI version is refused with the fix named."""

from __future__ import annotations

import ctypes

import pytest


def test_our_three_libraries_load_through_the_one_loader(llama_vq):
    from llama_vq import _backends, _cdll, chat
    from llama_vq.server import engine

    for spec in (_backends.GGML, chat.CHAT, engine.SERVER):
        lib = _cdll.load(spec)
        assert lib is _cdll.load(spec)  # once per process
        for name, (args, res) in spec.signatures.items():
            assert getattr(lib, name).argtypes == args and getattr(lib, name).restype == res, name
    assert _backends.devices()[0] == "CPU"


def test_a_missing_library_and_another_abi_are_refused_naming_the_fix(llama_vq):
    from llama_vq import _cdll
    from llama_vq.server.engine import EngineError

    with pytest.raises(EngineError, match="libno-such-thing.* is missing.*rebuild llama-vq"):
        _cdll.load(_cdll.Library("no-such-thing", error=EngineError))
    wrong = _cdll.Library(
        "llama-vq-chat",
        {"llama_vq_chat_abi_version": ([], ctypes.c_int)},
        abi_function="llama_vq_chat_abi_version",
        abi_version=999,
    )
    with pytest.raises(llama_vq.LlamaVQError, match="has ABI version 1, this package needs 999"):
        _cdll.load(wrong)
