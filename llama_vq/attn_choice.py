"""What ``-fa auto`` / ``flash_attn="auto"`` runs: the attention paths measured on this device, the choice cached.

For a model's attention shape (heads, KV heads, K and V head sizes, sinks), the cache types, the micro-batch and a
depth standing for the configured context, a one-layer stand-in of that shape (_synth_attn.py) is loaded on the
device the model's layers go to and timed two ways: flash attention, and llama-vq's attention without it (the split
chain for prompt batches, the fused decode attention on CUDA/HIP for decode). A prompt batch of n_ubatch tokens and
single-token decode steps are timed at that depth. The static rule's path (prefill mode on an accelerator with a
quantized V, llama-vq's attention on the CPU alone, flash attention without a quantized V) stays unless the other
path is faster by more than MARGIN, per batch kind; the two choices make the mode (flash for prompts and llama-vq's
for decode: "prefill"; flash for both: "on"; llama-vq's for both: "off").

The result is kept in a JSON file (LLAMA_VQ_ATTN_CACHE, default ``$XDG_CACHE_HOME/llama-vq/attn-choice.json``)
under a key of everything that changes the answer: the device's name and description, the GPU driver's version,
the backend, llama-vq's version and llama.cpp's commit, build and patches, the shape, the cache types, n_ubatch and
the depth. Any change is a new key and measures again; a file that cannot be read or parsed is ignored with one
warning. LLAMA_VQ_ATTN_TUNE=0 turns measuring off: auto is then the static rule, as before this module.

The native side (the placement check of 0018-llama-flash-attn-prefill-mode) still has the last word: the chosen mode
is passed as LLAMA_VQ_FA_AUTO, which auto tries first, and a mode that would move a layer's attention off its device
is passed over there.

``llama-vq-tune-attn`` (tune_attn.py) measures for a model ahead of a start and prints the table.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import _envs

log = logging.getLogger("llama_vq.attn_choice")

MARGIN = 0.05  # the other path must be more than 5 % faster (tok/s) to replace the static rule's
DEPTH_CAP_ACCEL = 32768  # tokens of depth measured at most on an accelerator (first start <= ~10 s on an H100)
DEPTH_CAP_CPU = 2048  # and on the CPU alone (2 cores: a few seconds)
CPU_FILL_WORK = 2048**2 * 9 * 128  # SmolLM2's shape (9 heads, head size 64) at DEPTH_CAP_CPU
DECODE_STEPS = 16
PROMPT_REPS = 3

FLASH, VQ = "flash", "llama-vq"


# --- the per-layer report (llama_vq_attn_layers) ---------------------------------------------------------------


@dataclass(frozen=True)
class AttnLayers:
    """One distinct layer kind of a context: what its prompt and decode batches run, its cache types, its device."""

    kind: str  # "full", "swa" (sliding-window) or "mtp"
    prompt: str  # "flash" (flash attention) or "llama-vq" (the attention without it)
    decode: str
    type_k: str
    type_v: str
    device: str
    n_layers: int

    def line(self) -> str:
        words = {"full": "full-attention", "swa": "sliding-window", "mtp": "MTP"}.get(self.kind, self.kind)
        return (
            f"attention, {words} layers ({self.n_layers}): prompt {_path_words(self.prompt)}, decode "
            f"{_path_words(self.decode)}; K {self.type_k}, V {self.type_v}; {self.device}"
        )


def _path_words(path: str) -> str:
    return "flash attention" if path == FLASH else "llama-vq's"


def parse_layers(text: str) -> list[AttnLayers]:
    """llama_vq_attn_layers()'s lines -> AttnLayers."""
    out = []
    for row in text.splitlines():
        f = row.split("\t")
        if len(f) == 7:
            out.append(AttnLayers(f[0], f[1], f[2], f[3], f[4], f[5], int(f[6])))
    return out


# --- the attention shape of a model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AttnShape:
    """The shape of a model's full-attention layers: what the stand-in reproduces."""

    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    sinks: bool

    def words(self) -> str:
        s = f"{self.n_head} heads / {self.n_head_kv} KV heads, K {self.head_k} / V {self.head_v}"
        return s + (", sinks" if self.sinks else "")


def model_shape(model_path: str | Path) -> AttnShape:
    """The full-attention layers' shape from a GGUF's metadata (per-layer arrays: the first full layer's)."""
    from ._gguf import read_metadata

    meta = read_metadata(model_path)
    arch = meta.get("general.architecture", "")

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    pattern = get("attention.sliding_window_pattern")
    il = 0
    if isinstance(pattern, list):
        il = next((i for i, swa in enumerate(pattern) if not swa), 0)

    def at(v: Any) -> int:
        if isinstance(v, list):
            v = v[il] if il < len(v) else v[0]
        return int(v or 0)

    n_head = at(get("attention.head_count"))
    n_head_kv = at(get("attention.head_count_kv", n_head)) or n_head
    n_embd = int(get("embedding_length", 0) or 0)
    head_k = at(get("attention.key_length", 0)) or (n_embd // n_head if n_head else 0)
    head_v = at(get("attention.value_length", 0)) or head_k
    if not (n_head and head_k and head_v):
        raise ValueError(f"{model_path}: no attention shape in its metadata (arch {arch!r})")
    # attention sinks are tensors, not metadata: the arches that carry them
    sinks = arch in ("mimo2", "gpt-oss")
    return AttnShape(n_head, n_head_kv, head_k, head_v, sinks)


# --- measuring ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timings:
    """tok/s of each path (None: the path is refused on this device, or did not run)."""

    prompt_flash: float | None
    prompt_vq: float | None
    decode_flash: float | None
    decode_vq: float | None


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    accelerator: bool
    driver: str


def model_device(gpu: bool = True) -> Device:
    """The device a model's layers go to by default (the first GPU), else (or without gpu: n_gpu_layers 0) the
    CPU."""
    from . import _backends

    lib = _backends.ggml()
    devs = _backends.local_model_devices(False) if gpu else []
    accel = bool(devs)
    if not accel:
        devs = [d for d in (lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count()))
                if lib.ggml_backend_dev_type(d) == _backends.DEV_CPU]  # fmt: skip
    props = _backends._DevProps()
    lib.ggml_backend_dev_get_props(devs[0], ctypes.byref(props))
    name = (props.name or b"?").decode(errors="replace")
    desc = (props.description or b"").decode(errors="replace")
    return Device(name, desc, accel, _driver_version() if accel else "")


def _driver_version() -> str:
    for p in ("/sys/module/nvidia/version", "/sys/module/amdgpu/version"):
        try:
            v = Path(p).read_text().strip()
        except OSError:
            continue
        if v:
            return f"{Path(p).parent.name} {v}"
    return "unknown"


def depth_for(n_ctx: int, accelerator: bool, shape: AttnShape | None = None) -> int:
    """The depth measured for a context of n_ctx cells: half of it (a request's mean depth over a full context),
    capped (LLAMA_VQ_ATTN_TUNE_DEPTH, else 32768 on an accelerator; on the CPU alone 2048, less for wide shapes: the
    fill's attention work, depth^2 x heads x (K + V head size), at most SmolLM2's at 2048, a few seconds on 2 cores),
    a multiple of 256, >= 256."""
    cap = DEPTH_CAP_ACCEL if accelerator else DEPTH_CAP_CPU
    if not accelerator and shape is not None:
        width = shape.n_head * (shape.head_k + shape.head_v)
        cap = min(cap, int(math.sqrt(CPU_FILL_WORK / width)))
    env = (_envs.get("LLAMA_VQ_ATTN_TUNE_DEPTH") or "").strip()
    if env:
        try:
            cap = max(256, int(env))
        except ValueError:
            log.warning("LLAMA_VQ_ATTN_TUNE_DEPTH=%s is not a number of tokens: using %d", env, cap)
    return max(256, min(n_ctx // 2, cap) // 256 * 256)


def measure(
    shape: AttnShape, type_k: int, type_v: int, n_ubatch: int, depth: int, n_threads: int | None, gpu: bool = True
) -> Timings:
    """Time both paths on the stand-in of shape: a prompt batch of n_ubatch tokens and single-token decode steps at
    depth cells, on the device a model goes to by default (gpu False: the CPU)."""
    import llama_cpp

    from . import _logs
    from ._synth_attn import time_path, write_attn_gguf

    with tempfile.TemporaryDirectory(prefix="llama-vq-attn-") as tmp:
        path = Path(tmp) / "attn.gguf"
        n_ctx = depth + n_ubatch + DECODE_STEPS
        n_ctx = (n_ctx + 255) // 256 * 256
        write_attn_gguf(
            path,
            n_head=shape.n_head,
            n_head_kv=shape.n_head_kv,
            head_k=shape.head_k,
            head_v=shape.head_v,
            n_ctx_train=n_ctx,
            sinks=shape.sinks,
        )
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 999 if gpu else 0
        with _logs.Capture():
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise RuntimeError("could not load the attention stand-in model")
        try:
            steps = (PROMPT_REPS, DECODE_STEPS)
            fa = time_path(model, True, type_k, type_v, n_ubatch, n_ctx, depth, n_threads, steps)
            vq = time_path(model, False, type_k, type_v, n_ubatch, n_ctx, depth, n_threads, steps)
        finally:
            llama_cpp.llama_model_free(model)
    return Timings(fa[0], vq[0], fa[1], vq[1])


# --- choosing ----------------------------------------------------------------------------------------------------


def static_mode(accelerator: bool, v_quantized: bool) -> str:
    """Today's rule (the native auto's without a preference): "prefill" on an accelerator with a quantized V,
    "off" on the CPU alone with one, "on" without one (flash attention where it runs)."""
    if not v_quantized:
        return "on"
    return "prefill" if accelerator else "off"


_MODE_PATHS = {"prefill": (FLASH, VQ), "on": (FLASH, FLASH), "off": (VQ, VQ)}


def mode_from_timings(t: Timings, accelerator: bool, v_quantized: bool, margin: float = MARGIN) -> str:
    """The mode the timings choose: per batch kind the static rule's path unless the other is faster by more than
    margin (and runs at all)."""
    default = static_mode(accelerator, v_quantized)
    d_prompt, d_decode = _MODE_PATHS[default]

    def pick(dflt: str, flash: float | None, vq: float | None) -> str:
        mine, other = (flash, vq) if dflt == FLASH else (vq, flash)
        if mine is None and other is not None:
            return VQ if dflt == FLASH else FLASH
        if other is not None and mine is not None and other > mine * (1 + margin):
            return VQ if dflt == FLASH else FLASH
        return dflt

    def loss(mode: str) -> float:  # how much slower than the faster path, prompt and decode multiplied
        p, d = _MODE_PATHS[mode]
        return _ratio(t.prompt_flash, t.prompt_vq, p) * _ratio(t.decode_flash, t.decode_vq, d)

    if not v_quantized:  # without a quantized V the paths do not mix: "on" or "off" throughout
        alt = "off" if default == "on" else "on"
        return alt if loss(alt) * (1 + margin) < loss(default) else default
    prompt = pick(d_prompt, t.prompt_flash, t.prompt_vq)
    decode = pick(d_decode, t.decode_flash, t.decode_vq)
    if (prompt, decode) == (VQ, FLASH):  # no such mode: the one that loses least
        return min(("on", "off"), key=loss)
    return next(m for m, paths in _MODE_PATHS.items() if paths == (prompt, decode))


def _ratio(flash: float | None, vq: float | None, path: str) -> float:
    best = max(x for x in (flash, vq, 0.0) if x is not None)
    mine = flash if path == FLASH else vq
    return best / mine if mine else float("inf")


@dataclass(frozen=True)
class Choice:
    """What auto runs and why: how "measured", "cached" or "static" (measuring off or impossible)."""

    mode: str
    how: str
    timings: Timings | None
    key: dict[str, Any] | None
    seconds: float = 0.0  # what measuring took (0 unless measured)

    def why(self) -> str:
        if self.how == "static":
            return "static rule"
        t = self.timings
        assert t is not None and self.key is not None
        return (
            f"{self.how} at depth {self.key['depth']}, ubatch {self.key['n_ubatch']}: prompt flash {_f(t.prompt_flash)}"
            f" / llama-vq {_f(t.prompt_vq)} tok/s, decode flash {_f(t.decode_flash)} / llama-vq {_f(t.decode_vq)} tok/s"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "how": self.how,
            "why": self.why(),
            "timings": asdict(self.timings) if self.timings else None,
            "seconds": round(self.seconds, 3),
        }


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


# --- the cache file -----------------------------------------------------------------------------------------------

_warned: set[str] = set()
_lock = threading.RLock()  # _write_cache reads (and may warn) under it


def cache_path() -> Path:
    env = (_envs.get("LLAMA_VQ_ATTN_CACHE") or "").strip()
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llama-vq" / "attn-choice.json"


def _warn_once(path: Path, what: str) -> None:
    with _lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    log.warning("attention choice cache %s %s: ignored (the choice is measured again)", path, what)


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        _warn_once(path, f"cannot be read ({e.strerror or e})")
        return {}
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
            raise ValueError("no entries")
        return doc["entries"]
    except ValueError:
        _warn_once(path, "is not a choice cache (corrupt)")
        return {}


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    with _lock:
        entries = _read_cache(path)
        entries[key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".attn-choice-", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump({"version": 1, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError as e:
            _warn_once(path, f"cannot be written ({e.strerror or e})")


def cache_key(
    device: Device, shape: AttnShape, type_k: int, type_v: int, n_ubatch: int, depth: int, n_threads: int | None
) -> dict[str, Any]:
    """Everything that changes the answer (module docstring)."""
    from ._build import build_info

    info = build_info()
    key: dict[str, Any] = {
        "device": device.name,
        "device_description": device.description,
        "driver": device.driver,
        "backend": info.backend,
        "llama_vq": info.version,
        "llama_cpp": f"{info.llama_cpp_commit} b{info.llama_cpp_build}",
        "patches": list(info.patches),
        "shape": asdict(shape),
        "type_k": type_k,
        "type_v": type_v,
        "n_ubatch": n_ubatch,
        "depth": depth,
    }
    if not device.accelerator:
        key["n_threads"] = n_threads or 0  # the CPU's speed depends on it
    return key


def tuning_enabled() -> bool:
    """LLAMA_VQ_ATTN_TUNE: unset or 1 measures; 0 keeps the static rule."""
    v = (_envs.get("LLAMA_VQ_ATTN_TUNE") or "").strip().lower()
    if v in ("", "1", "on", "true", "yes"):
        return True
    if v in ("0", "off", "false", "no"):
        return False
    log.warning("LLAMA_VQ_ATTN_TUNE=%s is not 0 or 1: measuring", v)
    return True


Measure = Callable[[AttnShape, int, int, int, int, int | None, bool], Timings]


def choose(
    model_path: str | Path,
    type_k: int,
    type_v: int,
    *,
    n_ubatch: int = 512,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    force: bool = False,
    measure_fn: Measure | None = None,
    device: Device | None = None,
) -> Choice:
    """The mode auto runs for this model and cache: cached, else measured and cached; the static rule when
    measuring is off (LLAMA_VQ_ATTN_TUNE=0) or the model's shape is unknown. force: measure even if cached.
    measure_fn, device: for tests (injected timings, a device of a given kind)."""
    from .cache_types import CACHE_TYPES

    dev = device or model_device()
    v_quant = any(t.ggml_type == type_v and t.quantized for t in CACHE_TYPES.values())
    static = Choice(static_mode(dev.accelerator, v_quant), "static", None, None)
    if not tuning_enabled():
        return static
    try:
        shape = model_shape(model_path)
    except (OSError, ValueError) as e:
        log.warning("attention choice: %s; the static rule", e)
        return static
    depth = depth_for(n_ctx, dev.accelerator, shape)
    key = cache_key(dev, shape, type_k, type_v, n_ubatch, depth, n_threads)
    key_s = json.dumps(key, sort_keys=True)
    path = cache_path()
    if not force:
        entry = _read_cache(path).get(key_s)
        if isinstance(entry, dict) and entry.get("mode") in _MODE_PATHS and isinstance(entry.get("timings"), dict):
            try:
                t = Timings(**entry["timings"])
            except TypeError:
                t = None
            if t is not None:
                return Choice(entry["mode"], "cached", t, key)
    t0 = time.perf_counter()
    try:
        t = (measure_fn or measure)(shape, type_k, type_v, n_ubatch, depth, n_threads, dev.accelerator)
    except Exception as e:  # noqa: BLE001 - measuring must never stop a start
        log.warning("attention choice: measuring failed (%s); the static rule", e)
        return static
    seconds = time.perf_counter() - t0
    mode = mode_from_timings(t, dev.accelerator, v_quant)
    _write_cache(
        path, key_s, {"mode": mode, "timings": asdict(t), "seconds": round(seconds, 3), "at": int(time.time())}
    )
    return Choice(mode, "measured", t, key, seconds)


@contextlib.contextmanager
def preferred(mode: str | None) -> Iterator[None]:
    """LLAMA_VQ_FA_AUTO=mode while the block creates a context (the native auto tries it first)."""
    if mode is None:
        yield
        return
    old = _envs.get("LLAMA_VQ_FA_AUTO")
    _envs.set_value("LLAMA_VQ_FA_AUTO", mode)
    try:
        yield
    finally:
        _envs.set_value("LLAMA_VQ_FA_AUTO", old)


def context_length(meta: dict[str, Any]) -> int:
    arch = meta.get("general.architecture", "")
    return int(meta.get(f"{arch}.context_length", 4096) or 4096)
