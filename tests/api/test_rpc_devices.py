"""A process that loaded a model on an rpc-server keeps working after that server has gone.

ggml registers an RPC device for the life of the process, and llama.cpp's default device selection takes every
registered device; its RPC backend aborts the process when a device's server cannot be reached. So, before, a
`Llama(rpc_servers=...)` followed by a plain `Llama(...)` once the rpc-server had stopped killed the process (the
second load asked the dead server for its memory). Now a model uses the RPC devices of its own rpc_servers and the
local devices, and an rpc_servers entry that nothing answers is a ConfigError naming the fix.

The snippet runs in a process of its own: the RPC device it registers must not reach the test process.
"""

from __future__ import annotations

import json

import pytest

_SCRIPT = """
import json, re, socket, subprocess, sys, time
import llama_vq
from llama_vq import _logs
from llama_vq.errors import ConfigError
model, tool, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
endpoint = f"127.0.0.1:{port}"
rpc = subprocess.Popen([tool, "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
end = time.monotonic() + 30
while True:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        assert rpc.poll() is None and time.monotonic() < end, "rpc-server not listening"
        time.sleep(0.05)
kw = dict(n_ctx=256, n_threads=1, n_gpu_layers=999, type_k="q8_0", type_v="q4_0", verbose=False)
line = re.compile(r"sched_reserve:\\s+(\\S+?)(?:\\[[^\\]]*\\])? compute buffer size")
out = {}

def load(name, **more):
    with _logs.Capture() as cap:
        llm = llama_vq.Llama(model, **kw, **more)
    text = llm.create_completion("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
    out[name] = {"devices": sorted(set(line.findall(cap.text()))), "text": text}
    llm.close()

try:
    load("remote", rpc_servers=endpoint)
finally:
    rpc.kill()
    rpc.wait()
load("local")
try:
    llama_vq.Llama(model, rpc_servers=endpoint, **kw)
    out["dead"] = None
except ConfigError as e:
    out["dead"] = str(e)
print(json.dumps(out))
"""


def test_a_model_loads_after_the_rpc_server_of_an_earlier_one_has_gone(smollm2_path, free_port, tmp_path):
    from script_support import run_script

    from llama_vq._cdll import BIN_DIR

    tool = BIN_DIR / "ggml-rpc-server"
    if not tool.exists():
        pytest.fail(f"{tool} is missing: the test suite builds llama-vq with LLAMA_VQ_BUILD_TOOLS=ON")
    out = json.loads(run_script(_SCRIPT, [str(smollm2_path), str(tool), str(free_port)], {}, tmp_path))
    print(f"\n{out}")
    assert out["remote"]["devices"] == ["CPU", "RPC0"], "the layers should have run on the rpc-server"
    assert out["local"]["devices"] == ["CPU"], "the second model should not use the first one's RPC device"
    # the same CPU kernels on both sides, greedy: the same text
    assert out["local"]["text"] == out["remote"]["text"] and out["local"]["text"].strip()
    assert out["dead"] is not None, "a model on an rpc-server that is gone should be refused"
    assert f"127.0.0.1:{free_port} cannot be reached" in out["dead"] and "Fix:" in out["dead"], out["dead"]
