"""Redaction (issue 55, items 1-2): only the credentials in use are secrets, redacted as typed values before a record
is serialised, so what is written always parses; an endpoint URL's password is a credential in use, in every form
httpx sends it (``user:password``, its base64 in ``Authorization: Basic``), even when a server echoes it back."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from agent.jsonio import dumps_record
from agent.redact import exempt, redact, redact_obj, register_key_var, register_secret, register_url, secrets
from tests.conftest import REPO


def _cmd(args, env, timeout=600):
    r = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return r


def test_only_registered_credentials_are_secrets_and_numbers_never(monkeypatch):
    monkeypatch.setenv("MAX_NEW_TOKENS", "131072")
    monkeypatch.setenv("TOKENIZER_NAME", "Qwen/Qwen3.5-9B")
    monkeypatch.setenv("MY_SECRET_PASSWORD", "hunter2-hunter2")  # secret-looking name, never named as a key
    line = {"sampling": {"max_tokens": 131072, "note": "131072 tokens"}, "model": "Qwen/Qwen3.5-9B",
            "text": "hunter2-hunter2"}
    assert redact_obj(line) is line and secrets() == []  # nothing registered: nothing changes
    register_key_var("MAX_NEW_TOKENS")  # even named as a key, a number is never a credential
    register_key_var("MY_SECRET_PASSWORD")
    got = json.loads(dumps_record(line))
    assert got["sampling"] == {"max_tokens": 131072, "note": "131072 tokens"}
    assert got["text"] == "[REDACTED]" and got["model"] == "Qwen/Qwen3.5-9B"
    b64 = base64.b64encode(b"hunter2-hunter2").decode()
    assert redact(f"echo {b64} and Bearer hunter2-hunter2") == "echo [REDACTED] and Bearer [REDACTED]"


def test_a_value_with_json_specials_is_redacted_and_the_record_still_parses():
    register_secret('k"ey\\with/specials')
    data = dumps_record({"reply": 'the server said k"ey\\with/specials', "n": 3})
    assert json.loads(data) == {"reply": "the server said [REDACTED]", "n": 3}


def test_a_urls_credentials_are_registered_in_every_form_httpx_sends():
    register_url("http://alice:s3cret%21pw@127.0.0.1:9/v1")
    basic = base64.b64encode(b"alice:s3cret!pw").decode()
    text = f"Authorization: Basic {basic}; pair alice:s3cret!pw; password s3cret!pw; as written s3cret%21pw"
    assert redact(text) == ("Authorization: Basic [REDACTED]; pair [REDACTED]; password [REDACTED]; "
                            "as written [REDACTED]")


def test_a_key_equal_to_a_name_the_run_records_is_not_redacted(monkeypatch, capsys):
    monkeypatch.setenv("ODD_KEY", "fake-qwen3.5")
    register_key_var("ODD_KEY")
    exempt("fake-qwen3.5")
    assert redact("model fake-qwen3.5") == "model fake-qwen3.5"
    assert "not redacted" in capsys.readouterr().err


def test_secret_looking_variables_holding_numbers_and_names_leave_every_record_parseable(tmp_path):
    """MAX_NEW_TOKENS=131072 and TOKENIZER_NAME=<the served model> in the environment: header.json and every
    result line parse, with their true values (the name-based redaction wrote ``"max_tokens": [REDACTED]``)."""
    from serving.fakes.sglang_server import FakeSGLang

    run = tmp_path / "run"
    env = {**os.environ, "MAX_NEW_TOKENS": "131072", "TOKENIZER_NAME": "fake-qwen3.5", "PYTHONPATH": str(REPO)}
    with FakeSGLang(reply="<think>\nlooking\n</think>\n\n<answer>a red square</answer>") as srv:
        r = _cmd(["agent.run", "--method", "react", "--backend", "openai", "--endpoint", srv.url, "--max-tokens",
                  "131072", "--benchmark", "demo", "--limit", "2", "--out", str(run), "--no-progress"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    header = json.loads((run / "header.json").read_text())
    assert header["sampling"]["max_tokens"] == 131072
    assert header["model"]["served_model"] == "fake-qwen3.5"
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(ln["status"] == "ok" for ln in lines)
    assert "[REDACTED]" not in (run / "results.jsonl").read_text() + (run / "header.json").read_text()


@pytest.mark.slow
def test_an_endpoint_password_is_in_no_file_and_no_console_line_even_when_the_server_echoes_it(tmp_path):
    """``--endpoint http://alice:PW@host`` sends ``Authorization: Basic base64(alice:PW)``; a server that puts that
    header, the pair and the password into its replies and its error bodies gets none of them into any file of the
    run or the console of the run, the judge and the viewer."""
    from serving.fakes.sglang_server import FakeSGLang

    pw = "s3cret-Pw-4711"
    pair = f"alice:{pw}"
    forms = [pw, pair, base64.b64encode(pair.encode()).decode()]

    def echo(req):
        auth = req.get("_authorization")
        return f"<think>\nI was sent {auth}; {pair}\n</think>\n\n<answer>{auth} {pw}</answer>"

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    console = ""
    with FakeSGLang(reply=echo) as srv:
        srv.faults = ["500_echo"]
        endpoint = srv.url.replace("http://", f"http://{pair}@")
        for args in (["agent.run", "--method", "react", "--backend", "openai", "--endpoint", endpoint, "--benchmark",
                      "demo", "--limit", "2", "--out", str(run), "--no-progress"],
                     ["agent.judge", str(run), "--judge-endpoint", endpoint, "--judge-model", "fake-qwen3.5",
                      "--no-progress"],
                     ["agent.show", str(run)]):
            r = _cmd(args, env)
            console += r.stdout + r.stderr
            assert r.returncode == 0, (args[0], r.stderr[-3000:])
        assert srv.injected["500_echo"] == 1
    assert "Basic" in (run / "results.jsonl").read_text()  # the echo landed in the record, redacted
    assert "[REDACTED]" in (run / "results.jsonl").read_text()
    leaked = [(str(p.relative_to(run)), f) for p in run.rglob("*") if p.is_file() for f in forms
              if f.encode() in p.read_bytes()]
    assert leaked == []
    assert [f for f in forms if f in console] == []
