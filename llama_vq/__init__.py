"""llama-vq: llama-cpp-python whose llama.cpp runs a quantized V cache with flash attention off.

    from llama_vq import Llama
    llm = Llama("model.gguf", type_k="q4_0", type_v="q4_0", flash_attn=False)

Importing llama_vq binds llama_cpp to llama_vq's own native library; import it before anything
imports llama_cpp.
"""

from __future__ import annotations

from . import _llama_cpp

_llama_cpp.bind()  # before anything imports llama_cpp

from . import _backends  # noqa: E402

_backends.load()  # a wheel build's backend modules (GGML_BACKEND_DL), before any model or context
_llama_cpp.check_series()  # a libllama without the whole patch series is refused here, once
_llama_cpp.install()

from ._build import BuildInfo, build_info  # noqa: E402
from ._validate import check_config  # noqa: E402
from .cache_types import CACHE_TYPES, CacheType, parse_cache_type, parse_flash_attn  # noqa: E402
from .chat import (  # noqa: E402
    ChatMessage,
    ChatParams,
    ChatStream,
    ChatTemplateError,
    ChatTemplates,
    StreamEnd,
    TemplateInfo,
    ToolCall,
    builtin_templates,
)
from .errors import (  # noqa: E402
    BindingError,
    CacheConfigError,
    ConfigError,
    ContextCreationError,
    DefaultModelError,
    LlamaVQError,
    ModelLoadError,
    TensorOverrideError,
)
from .llama import KVCacheInfo, Llama  # noqa: E402
from .models import default_model_path  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BindingError",
    "BuildInfo",
    "CACHE_TYPES",
    "CacheConfigError",
    "CacheType",
    "ChatMessage",
    "ChatParams",
    "ChatStream",
    "ChatTemplateError",
    "ChatTemplates",
    "ConfigError",
    "ContextCreationError",
    "DefaultModelError",
    "KVCacheInfo",
    "Llama",
    "LlamaVQError",
    "ModelLoadError",
    "StreamEnd",
    "TemplateInfo",
    "TensorOverrideError",
    "ToolCall",
    "build_info",
    "builtin_templates",
    "check_config",
    "default_model_path",
    "parse_cache_type",
    "parse_flash_attn",
]
