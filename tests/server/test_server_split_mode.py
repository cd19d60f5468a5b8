"""-sm row at the pinned llama.cpp: llama-model.cpp asks each device's backend for a split buffer type; ggml-cuda (which
HIP compiles too) and ggml-rpc provide none, so loading fails ("device CUDA0 does not support split buffers") whatever
the cache types. llama-vq-server refuses it before loading, with the way out (-sm layer) in the message.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from script_support import run_script
from server_support import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "vendor" / "llama.cpp"


def _listening(port: int, proc: subprocess.Popen, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"ggml-rpc-server exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # polling interval against the deadline
    raise TimeoutError(f"ggml-rpc-server: nothing listens on {port} after {deadline_s} s")


def test_pinned_llama_cpp_has_no_split_buffer_for_cuda_hip_or_rpc():
    # the reason for the refusal, read from the pinned source: when a pin bump brings a split buffer back to ggml-cuda,
    # this fails, and the refusal (llama_vq/server/settings.py) must be revisited
    if not VENDOR.exists():
        pytest.skip("vendor/llama.cpp not fetched (scripts/run.sh setup fetches it)")
    model = (VENDOR / "src" / "llama-model.cpp").read_text()
    assert '"ggml_backend_split_buffer_type"' in model and "does not support split buffers" in model
    for backend in ("ggml-cuda/ggml-cuda.cu", "ggml-rpc/ggml-rpc.cpp"):
        assert "ggml_backend_split_buffer_type" not in (VENDOR / "ggml" / "src" / backend).read_text(), backend


def test_row_split_fails_to_load_on_a_device_without_split_buffers(smollm2_path, tmp_path):
    # what the refusal saves users from, on an RPC device (the CPU's stand-in for a GPU): the load fails
    from llama_vq._cdll import BIN_DIR

    rpc = BIN_DIR / "ggml-rpc-server"
    if not rpc.exists():
        pytest.skip("built without the tools (LLAMA_VQ_BUILD_TOOLS=ON): no ggml-rpc-server")
    port = free_port()
    server = subprocess.Popen([str(rpc), "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _listening(port, server)
        script = (
            "import sys, llama_vq, llama_cpp\n"
            "from llama_vq.errors import ModelLoadError\n"
            "try:\n"
            "    llama_vq.Llama(sys.argv[1], rpc_servers=sys.argv[2], split_mode=llama_cpp.LLAMA_SPLIT_MODE_ROW,\n"
            "                   n_gpu_layers=99)\n"
            "    print('loaded')\n"
            "except ModelLoadError as e:\n"
            "    print(e.reason)\n"
        )
        last = run_script(script, [str(smollm2_path), f"127.0.0.1:{port}"], {}, tmp_path)
    finally:
        server.terminate()
        server.wait(30)
    assert "device RPC0 does not support split buffers" in last


@pytest.mark.parametrize(
    "argv,env,expect",
    [
        (["-sm", "row"], {}, "row"),
        (["--split-mode", "row"], {}, "row"),
        ([], {"LLAMA_ARG_SPLIT_MODE": "row"}, "row"),
        (["-sm", "none"], {}, "none"),
        ([], {}, "layer"),  # llama.cpp's default
    ],
)
def test_engine_reports_the_split_mode_llama_cpp_parsed(smollm2_path, tmp_path, argv, env, expect):
    script = "import sys\nfrom llama_vq.server.engine import Engine\nprint(Engine(sys.argv[1:]).params['split_mode'])\n"
    assert run_script(script, ["-m", str(smollm2_path), *argv], env, tmp_path) == expect


def test_settings_refuse_the_row_split_and_keep_the_others():
    from llama_vq.server.options import OptionError
    from llama_vq.server.settings import Settings

    with pytest.raises(OptionError, match=r"-sm row .* use -sm layer -ts A,B"):
        Settings.build({}, {"split_mode": "row"})
    for mode in ("none", "layer", "tensor"):
        Settings.build({}, {"split_mode": mode})


@pytest.mark.parametrize("flags,env", [(("-sm", "row"), {}), ((), {"LLAMA_ARG_SPLIT_MODE": "row"})])
def test_server_refuses_the_row_split_before_loading_the_model(smollm2_path, tmp_path, flags, env):
    s = ServerProcess(smollm2_path, *flags, "-lv", "4", log_dir=tmp_path, env=env)
    try:
        assert s.proc.wait(timeout=120) == 1
        log = s.log()
        assert "-sm row" in log and "does not support split buffers" in log and "use -sm layer -ts A,B" in log
        assert "load_model" not in log and "load_tensors" not in log  # refused before anything loaded
    finally:
        s.stop()
