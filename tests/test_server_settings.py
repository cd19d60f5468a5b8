"""Server configuration: flags, LLAMA_VQ_* variables, validation, exit status 2 before loading."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from server.settings import SettingsError, parse_settings


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return p


def test_defaults_are_loopback_f16_and_no_key(model_file):
    s = parse_settings(["-m", str(model_file)], {})
    assert (s.host, s.port, s.ctx_size) == ("127.0.0.1", 8080, 4096)
    assert (s.cache_type_k, s.cache_type_v, s.flash_attn) == ("f16", "f16", "auto")
    assert s.api_keys == () and s.loopback and s.state_dir is None


def test_llama_server_flags_map_onto_settings(model_file, tmp_path):
    s = parse_settings(
        [
            "-m",
            str(model_file),
            "-c",
            "65536",
            "-ngl",
            "all",
            "-sm",
            "row",
            "-ts",
            "3,1",
            "-mg",
            "1",
            "-ot",
            r"blk\.1[0-9]\.ffn_.*_exps=CPU",
            "--override-tensor",
            "exps=CUDA0,norm=CPU",
            "-ctk",
            "Q8_0",
            "-ctv",
            "q4_0",
            "-fa",
            "off",
            "-t",
            "8",
            "-b",
            "1024",
            "-ub",
            "256",
            "--rpc",
            "10.0.0.2:50052,host:1",
            "--alias",
            "mimo,default",
            "--state-dir",
            str(tmp_path / "kv"),
            "--state-budget",
            "1.5G",
            "--max-queue",
            "3",
            "--api-key",
            "k1,k2",
        ],
        {},
    )
    assert s.ctx_size == 65536 and s.n_gpu_layers == -1 and s.split_mode_value == 2
    assert s.tensor_split == (3.0, 1.0) and s.main_gpu == 1
    assert s.override_tensor == (
        (r"blk\.1[0-9]\.ffn_.*_exps", "CPU"),
        ("exps", "CUDA0"),
        ("norm", "CPU"),
    )
    assert (s.cache_type_k, s.cache_type_v, s.flash_attn) == ("q8_0", "q4_0", "off")
    assert (s.threads, s.batch_size, s.ubatch_size) == (8, 1024, 256)
    assert s.rpc == ("10.0.0.2:50052", "host:1") and s.alias == ("mimo", "default")
    assert s.state_dir == (tmp_path / "kv").resolve() and s.state_dir.is_dir()
    assert s.state_budget == int(1.5 * 2**30) and s.max_queue == 3 and s.api_keys == ("k1", "k2")


def test_environment_variables_configure_and_flags_win(model_file):
    env = {
        "LLAMA_VQ_MODEL": str(model_file),
        "LLAMA_VQ_CTX_SIZE": "2048",
        "LLAMA_VQ_PORT": "9000",
        "LLAMA_VQ_OVERRIDE_TENSOR": "exps=CPU",
        "LLAMA_VQ_VERBOSE": "1",
        "LLAMA_VQ_API_KEY": "sekret",
    }
    s = parse_settings(["--port", "9001"], env)
    assert s.model == model_file.resolve() and s.ctx_size == 2048 and s.port == 9001
    assert s.override_tensor == (("exps", "CPU"),) and s.verbose and s.api_keys == ("sekret",)


def test_api_key_file_takes_one_key_per_line(model_file, tmp_path):
    f = tmp_path / "keys"
    f.write_text("# comment\nalpha\n\n beta \n")
    assert parse_settings(["-m", str(model_file), "--api-key-file", str(f)], {}).api_keys == (
        "alpha",
        "beta",
    )


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--ctx-size", "lots"], {}, "--ctx-size 'lots': must be an integer"),
        (["--port", "70000"], {}, "--port '70000': must be <= 65535"),
        ([], {"LLAMA_VQ_CTX_SIZE": "-5"}, "LLAMA_VQ_CTX_SIZE '-5': must be >= 0"),
        (["-ctv", "q3_k"], {}, "--cache-type-v 'q3_k': must be one of"),
        (["-fa", "maybe"], {}, "must be one of on, off, auto"),
        (["-sm", "diagonal"], {}, "must be one of none, layer, row"),
        (["-ts", "1,-1"], {}, "non-negative proportion"),
        (["-ot", "exps"], {}, "is not PATTERN=BUFFER"),
        (["-ot", "blk.(=CPU"], {}, "not a valid regular expression"),
        (["--rpc", "host"], {}, "is not host:port"),
        (["--state-budget", "lots"], {}, "must be a size"),
        (["--api-key-file", "/nonexistent/keys"], {}, "cannot read it"),
        (["--chat-template-kwargs", "{enable_thinking: true}"], {}, "--chat-template-kwargs"),
        (["--chat-template-kwargs", "[1]"], {}, "must be a JSON object"),
        (["--reasoning-format", "r1"], {}, "must be one of none, deepseek, deepseek-legacy, auto"),
        (["--chat-template-file", "/nonexistent/t.jinja"], {}, "cannot read it"),
        (["--cors-origin", "example.com"], {}, "is not '*' or an origin"),
        (["--host", "127.0.0.1,,::1"], {}, "lists an empty address"),
    ],
)
def test_bad_values_are_refused_with_the_option_and_the_rule(model_file, argv, env, says):
    with pytest.raises(SettingsError, match=None) as e:
        parse_settings(["-m", str(model_file), *argv], env)
    assert says in str(e.value)


def test_missing_model_file_is_refused(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        parse_settings(["-m", str(tmp_path / "nope.gguf")], {})


def test_api_key_value_is_never_echoed_in_errors(model_file):
    with pytest.raises(SettingsError) as e:
        parse_settings(["-m", str(model_file), "--api-key", "   "], {})
    assert "--api-key" in str(e.value)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_cli_exits_2_with_a_clear_message_before_loading_the_model(tmp_path, smollm2_path):
    r = _cli("-m", str(smollm2_path), "--ctx-size", "abc", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "--ctx-size 'abc': must be an integer" in r.stderr and "usage:" in r.stderr
    assert "loading" not in r.stderr


def test_cli_exits_2_for_a_cache_type_the_build_cannot_run(tmp_path, smollm2_path, build):
    message = "type_v='q4_0' with flash_attn off needs llama-vq's V patch"
    if build.nonfa_quantized_v:
        # the CLI's check is llama_vq's validation function: run it as a build without the V patch does
        import llama_vq
        from llama_vq._validate import check_cache_config

        with pytest.raises(llama_vq.CacheConfigError, match=re.escape(message)):
            check_cache_config(smollm2_path, llama_vq.parse_cache_type("f16"), llama_vq.parse_cache_type("q4_0"),
                               llama_vq.parse_flash_attn("off"), nonfa_quantized_v=False)
        return
    r = _cli("-m", str(smollm2_path), "-ctv", "q4_0", "-fa", "off", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


def test_cli_help_lists_flags_and_their_environment_variables(tmp_path):
    r = _cli("--help", cwd=tmp_path)
    assert r.returncode == 0
    for flag in (
        "--override-tensor",
        "--cache-type-v",
        "--flash-attn",
        "--state-dir",
        "--rpc",
        "LLAMA_VQ_CTX_SIZE",
        "LLAMA_VQ_API_KEY",
        "PATTERN=BUFFER",
    ):
        assert flag in r.stdout


@pytest.mark.parametrize(
    ("value", "disabled"),
    [(None, False), ("", False), ("0", False), ("1", True), (" 2x", True), ("-1", True), ("yes", False)],
)
def test_attn_rotation_disabled_reads_the_variable_as_llama_cpp_does(value, disabled):
    """llama.cpp takes atoi(LLAMA_ATTN_ROT_DISABLE): a leading integer, 0 for anything else."""
    from server.engine import attn_rotation_disabled

    env = {} if value is None else {"LLAMA_ATTN_ROT_DISABLE": value}
    assert attn_rotation_disabled(env) is disabled


@pytest.mark.parametrize(
    ("argv", "batch", "ubatch"),
    [([], 512, 512), (["-b", "32"], 32, 32), (["-b", "256", "-ub", "512"], 256, 256), (["-ub", "64"], 512, 64)],
)
def test_micro_batch_is_lowered_to_the_batch_as_llama_cpp_does(model_file, argv, batch, ubatch):
    s = parse_settings(["-m", str(model_file), *argv], {})
    assert (s.batch_size, s.ubatch_size) == (batch, ubatch)


def test_chat_flags_parse_with_llama_server_spelling(model_file, tmp_path):
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text("{{ messages[0]['content'] }}")
    s = parse_settings(
        ["-m", str(model_file), "--chat-template-file", str(tmpl), "--chat-template-kwargs",
         '{"enable_thinking": true}', "--reasoning-format", "deepseek", "--cors-origin",
         "https://a.example, http://localhost:3000/", "--host", "127.0.0.1,[::1]"],
        {},
    )
    assert s.jinja is True and s.chat_template_file == tmpl.resolve()
    assert s.chat_template_kwargs == {"enable_thinking": True} and s.reasoning_format == "deepseek"
    assert s.cors_origins == ("https://a.example", "http://localhost:3000")
    assert s.hosts == ("127.0.0.1", "::1") and s.loopback
    assert parse_settings(["-m", str(model_file), "--no-jinja"], {}).jinja is False
    assert parse_settings(["-m", str(model_file)], {"LLAMA_VQ_JINJA": "0"}).jinja is False
    assert parse_settings(["-m", str(model_file)], {}).cors_origins == ()


def test_cli_lowers_the_micro_batch_and_listens_on_every_host(tmp_path, smollm2_path):
    """`-b 32` alone runs (llama-server's behaviour); --host takes IPv4 and IPv6 loopback at once."""
    import socket

    from server_support import ServerProcess

    try:
        with socket.socket(socket.AF_INET6) as s6:
            s6.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"this machine has no IPv6 loopback ({e})")
    srv = ServerProcess(smollm2_path, "-b", "32", "--host", "127.0.0.1,::1", log_dir=tmp_path)
    try:
        srv.wait_ready()
        import httpx

        assert httpx.get(f"http://[::1]:{srv.port}/health", timeout=10).status_code == 200
    finally:
        srv.stop()


def test_cli_bind_failure_names_the_address_and_exits_1(tmp_path, smollm2_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _cli("-m", str(smollm2_path), "--port", str(port), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1 port {port}" in r.stderr and "in use" in r.stderr
    r = _cli("-m", str(smollm2_path), "--host", "no-such-host.invalid", cwd=tmp_path)
    assert r.returncode == 1 and "cannot listen on 'no-such-host.invalid'" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--chat-format", "chatml-function-calling"], "use --chat-template NAME"),
        (["--no-jinja"], "--no-jinja needs --chat-template NAME"),
        (["--chat-template", "{% for m in messages %}{{ m.content }"], "--chat-template:"),
    ],
)
def test_cli_exits_2_for_chat_template_flags_that_cannot_work(tmp_path, smollm2_path, args, says):
    r = _cli("-m", str(smollm2_path), *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "loading" not in r.stderr


def test_kv_unified_is_the_default_and_no_kv_unified_splits_it(model_file):
    assert parse_settings(["-m", str(model_file)], {}).kv_unified is True
    assert parse_settings(["-m", str(model_file), "-kvu"], {}).kv_unified is True
    assert parse_settings(["-m", str(model_file), "--no-kv-unified"], {}).kv_unified is False
    assert parse_settings(["-m", str(model_file), "-no-kvu"], {}).kv_unified is False
    with pytest.raises(SettingsError, match="choose one"):
        parse_settings(["-m", str(model_file), "-kvu", "--no-kv-unified"], {})
