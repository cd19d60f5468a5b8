"""What native build this package carries: backend, GPU targets, llama.cpp commit, patches."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from . import _backends
from ._cdll import build_config


@dataclass(frozen=True)
class BuildInfo:
    """Returned by build_info(); also a Mapping-like via ``as_dict()`` and ``info["backend"]``."""

    version: str
    backend: str
    gpu_targets: list[str]
    cpu_features: list[str]
    llama_cpp_commit: str
    llama_cpp_build: str
    llama_cpp_python: str
    patches: list[str]
    tools: list[str]
    system_info: str = ""
    backend_dl: bool = False  # backends are modules loaded at run time (a wheel build)
    cpu_variant: str | None = None  # the CPU module loaded (a DL build): "x64", "haswell", "skylakex", "icelake"
    backend_modules: list[str] = field(default_factory=list)  # the modules loaded, CPU last (a DL build)
    backend_notes: list[str] = field(default_factory=list)  # said once at import: a GPU module that runs no GPU, why

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]


def build_info() -> BuildInfo:
    """Backend, GPU targets, llama.cpp commit/build, applied patches and llama.cpp's system info."""
    import llama_cpp  # bound to llama_vq/lib by the package import

    loaded = _backends.load()
    cfg = build_config()
    sysinfo = llama_cpp.llama_print_system_info().decode(errors="replace")
    return BuildInfo(
        version=cfg["version"],
        backend=cfg["backend"],
        gpu_targets=list(cfg.get("gpu_targets", [])),
        cpu_features=list(cfg.get("cpu_features", [])),
        llama_cpp_commit=cfg["llama_cpp_commit"],
        llama_cpp_build=cfg.get("llama_cpp_build", "0"),
        llama_cpp_python=cfg["llama_cpp_python"],
        patches=list(cfg.get("patches", [])),
        tools=list(cfg.get("tools", [])),
        system_info=sysinfo.strip(),
        backend_dl=loaded.backend_dl,
        cpu_variant=loaded.cpu_variant,
        backend_modules=list(loaded.modules),
        backend_notes=list(loaded.notes),
    )
