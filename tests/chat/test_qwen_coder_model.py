"""tests/support/qwen_coder_support.py: the Qwen2.5-Coder-0.5B-Instruct test model is fetched, joined, checked and
loads.

CPU cost: a vocab-only load (~1 s) once the model is cached; the first run fetches ~470 MB.
"""

from __future__ import annotations

import pytest


def test_qwen_coder_model_is_cached_under_its_pinned_sha256(qwen_coder_path):
    import qwen_coder_support as qwen_coder

    assert qwen_coder_path.name == qwen_coder.MODEL_NAME
    marker = qwen_coder_path.with_name(qwen_coder_path.name + ".sha256")
    assert marker.read_text().strip() == qwen_coder.GGUF_SHA256
    assert qwen_coder.qwen_coder_path(fetch=False) == qwen_coder_path
    with qwen_coder_path.open("rb") as f:
        assert f.read(4) == b"GGUF"


def test_qwen_coder_model_loads_as_qwen2_with_a_tool_calling_chat_template(llama_vq, qwen_coder_path):
    llm = llama_vq.Llama(str(qwen_coder_path), vocab_only=True, verbose=False)
    assert llm.metadata["general.architecture"] == "qwen2"
    template = llm.metadata["tokenizer.chat_template"]
    assert "tools" in template and "<tool_call>" in template


def test_qwen_coder_path_without_fetch_names_the_fix_when_the_cache_is_empty(tmp_path, monkeypatch, llama_vq):
    import qwen_coder_support as qwen_coder

    monkeypatch.setenv("LLAMA_VQ_CACHE", str(tmp_path))
    with pytest.raises(qwen_coder.QwenCoderModelError, match="python tests/support/qwen_coder_support.py path"):
        qwen_coder.qwen_coder_path(fetch=False)
