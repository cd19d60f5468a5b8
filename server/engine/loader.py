"""Model and context creation for the engine (worker thread): llama_vq.Llama with one sequence per
slot in a unified KV cache (a stream per slot with --no-kv-unified), the windowed SWA cache unless
--swa-full, then the caches and the loop."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("llama_vq.server.engine")


def load(engine: Any) -> None:
    """Load the model and context, then wire the engine's caches, core and scheduler onto ``engine``."""
    import llama_cpp  # noqa: PLC0415 (after llama_vq bound it)

    from ..kv_store import KVStore  # noqa: PLC0415
    from .cache_policy import CachePolicy  # noqa: PLC0415
    from .engine import Core  # noqa: PLC0415
    from .prompt_cache import RamCache  # noqa: PLC0415
    from .scheduler import Scheduler  # noqa: PLC0415

    s = engine.settings
    t0 = time.monotonic()
    llm = _open_llama(engine)
    n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
    kv = _describe(engine, llm, n_swa)
    log.info(
        "model loaded in %.1f s: %s (SWA window %d, %s SWA cache)",
        time.monotonic() - t0,
        engine.model_path.name,
        n_swa,
        "full-size" if s.swa_full else "windowed",
    )
    identity = engine.identity(kv, bool(llm.flash_attn))
    m = engine.metrics
    if s.state_dir is not None:
        events = {"save": m.state_saves, "reject": m.state_rejected, "evict": m.state_evictions}
        engine.store = KVStore(s.state_dir, identity, s.state_budget, on_event=lambda kind, n: events[kind].inc(n))
    engine.ram = RamCache(s.cache_ram, engine.identity_hash(identity))
    core = Core(llm, s, n_swa, engine._on_done)
    policy = CachePolicy(core, engine.ram, engine.store, on_restore=m.state_restored_tokens.inc)

    def observe(name: str, value: float) -> None:
        if name == "ttft":
            m.ttft.observe(value)
        elif name == "tpot":
            m.token_latency.observe(value)
        elif name == "decode_seconds":  # one llama_decode() over the busy slots (llamacpp:n_decode_total)
            m.llamacpp.decoded(max(engine.running, 1))

    engine.llama = llm
    engine._core = core
    engine._sched = Scheduler(core, engine._queue, policy, observe)


def _open_llama(engine: Any) -> Any:
    """The llama_vq.Llama (model + one context of n_seq_max = slots, unified KV unless --no-kv-unified) the
    settings describe."""
    import llama_vq  # noqa: PLC0415

    s = engine.settings
    return llama_vq.Llama(
        str(engine.model_path),
        n_ctx=s.ctx_size,
        n_gpu_layers=s.n_gpu_layers,
        split_mode=s.split_mode_value,
        main_gpu=s.main_gpu,
        tensor_split=list(s.tensor_split) if s.tensor_split else None,
        tensor_overrides=list(s.override_tensor) or None,
        rpc_servers=",".join(s.rpc) or None,
        type_k=s.cache_type_k,
        type_v=s.cache_type_v,
        type_k_swa=s.cache_type_k_swa,
        type_v_swa=s.cache_type_v_swa,
        flash_attn=s.flash_attn,
        n_threads=s.threads,
        n_threads_batch=s.threads,  # as llama-server's -tb: -t's value (llama_cpp's default is every CPU)
        n_batch=s.batch_size,
        n_ubatch=s.ubatch_size,
        n_seq_max=s.parallel,
        kv_unified=s.kv_unified,
        swa_full=s.swa_full,
        verbose=s.verbose,
    )


def _describe(engine: Any, llm: Any, n_swa: int) -> Any:
    """Set ``engine.info`` (what /health, /props and /v1/models report); return the KV cache's description."""
    import llama_cpp  # noqa: PLC0415

    import llama_vq  # noqa: PLC0415

    from .engine import ModelInfo  # noqa: PLC0415

    s = engine.settings
    try:
        kv = llm.kv_cache_info()
    except RuntimeError:  # recurrent / hybrid memory: no plain KV cache to report
        kv = llama_vq.KVCacheInfo(s.cache_type_k, s.cache_type_v, 0, 0, 0)
    template = str(llm.metadata.get("tokenizer.chat_template", ""))
    engine.info = ModelInfo(
        names=engine.names,
        path=str(engine.model_path),
        n_ctx=int(llama_cpp.llama_n_ctx_seq(llm.ctx)),
        n_vocab=llm.n_vocab(),
        cache_type_k=kv.type_k,
        cache_type_v=kv.type_v,
        flash_attn=bool(llm.flash_attn),
        kv_k_bytes=kv.k_bytes,
        kv_v_bytes=kv.v_bytes,
        n_swa=n_swa,
        swa_full=bool(s.swa_full),
        n_slots=s.parallel,
        supports_tools="tools" in template,
        created=int(time.time()),
    )
    return kv
