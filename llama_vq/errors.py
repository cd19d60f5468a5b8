"""Exception classes of llama_vq: one class per kind of failure."""

from __future__ import annotations


class LlamaVQError(Exception):
    """Base class of every error llama_vq raises on purpose."""


class ConfigError(LlamaVQError, ValueError):
    """A configuration that cannot work, detected before any native call.

    The message names the value, the constraint and the fix.
    """


class CacheConfigError(ConfigError):
    """A KV cache type / flash-attention combination that cannot work with this model or build."""


class TensorOverrideError(ConfigError):
    """A tensor override that is not PATTERN=BUFFER with a valid regex and a known buffer type."""


class ContextCreationError(LlamaVQError, RuntimeError):
    """llama.cpp refused to create the context; ``reason`` carries llama.cpp's own words."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class ModelLoadError(LlamaVQError, RuntimeError):
    """llama.cpp could not load the model; ``reason`` carries llama.cpp's own words."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class BindingError(LlamaVQError, ImportError):
    """llama_cpp is bound to a native library other than llama_vq's own."""


class DefaultModelError(LlamaVQError, RuntimeError):
    """The embedded default model could not be obtained (download or checksum)."""
