"""Multipart bodies, answered as llama-server answers them (it turns a form's text fields into the JSON body,
repeated keys into arrays, and hands files to the handler): /completion form fields and the audio route.

Each expected answer is stock llama-server's to the same request (SmolLM2, no --mmproj; benchmarks/RESULTS.md,
the probe matrix).

CPU cost: one server, three 4-token generations.
"""

from __future__ import annotations

import httpx
import pytest
from server_support import running

pytestmark = pytest.mark.slow

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "  # a WAV header: the route refuses before reading it


def _form(srv, path: str, fields: list[tuple[str, str]]) -> httpx.Response:  # noqa: ANN001
    """A multipart/form-data body of text fields, in order (httpx makes one only when a file is sent)."""
    parts = [f'--b\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields]
    body = ("".join(parts) + "--b--\r\n").encode()
    return httpx.post(
        srv.url + path, content=body, headers={"content-type": "multipart/form-data; boundary=b"}, timeout=120
    )


@pytest.fixture(scope="module")
def srv(smollm2_path, tmp_path_factory):
    # --ignore-eos: every generation is the 4 tokens of -n (sampling may otherwise end one early at an EOS)
    with running(smollm2_path, "-n", "4", "--ignore-eos", log_dir=tmp_path_factory.mktemp("multipart")) as s:
        yield s


def test_completion_form_fields_are_the_json_body(srv):
    r = _form(srv, "/completion", [("prompt", "The capital of France is")])
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["tokens_predicted"] == 4 and isinstance(doc["content"], str)


def test_a_repeated_form_field_is_an_array(srv):
    r = _form(srv, "/completion", [("prompt", "One,"), ("prompt", "Two,")])
    assert r.status_code == 200, r.text
    assert [d["index"] for d in r.json()] == [0, 1]  # two prompts, two completions


def test_form_fields_are_strings_so_a_number_field_is_a_400(srv):
    r = _form(srv, "/completion", [("prompt", "Hi"), ("n_predict", "2")])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "n_predict" in err["message"], err


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/audio/transcriptions"])
def test_audio_transcription_without_an_audio_model_is_a_501(srv, path):
    r = httpx.post(srv.url + path, data={"model": "x"}, files={"file": ("a.wav", WAV, "audio/wav")}, timeout=120)
    assert r.status_code == 501, r.text
    assert r.json()["error"] == {
        "code": 501,
        "message": "The current model does not support audio input.",
        "type": "not_supported_error",
    }


def test_a_malformed_form_is_a_400(srv):
    body = b'--x\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nHi'  # no closing boundary
    r = httpx.post(
        srv.url + "/completion", content=body, headers={"content-type": "multipart/form-data; boundary=x"}, timeout=120
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
