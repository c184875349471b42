"""`cadence agents list|show|apply`, `cadence chat` and `cadence ingest` as a developer runs
them: the real command line against a real server on loopback (engines are fakes built on
the real interfaces, so the test is about the commands, not the models)."""

from __future__ import annotations

import io
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agent import agents_cli
from agent.config import CadenceConfig, StoreConfig
from pipelines.voice import Engines
from tests.conftest import REPO_ROOT, running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS


@pytest.fixture
def url(default_config: CadenceConfig, tmp_path: Path):
    config = replace(default_config, store=StoreConfig(path=str(tmp_path / "cadence.sqlite3")))
    engines = Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["We open at eight."]), tts=ToneTTS(),
                      embedder=HashingEmbedder())
    with running_server(config, engines) as server:
        yield server.base_url


def cadence(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT)


@pytest.mark.slow
def test_agents_apply_list_show_chat_and_ingest(url, tmp_path):
    agent_file = tmp_path / "bakery.yaml"
    agent_file.write_text("name: bakery\nsystem_prompt: You take bread orders.\ngreeting: Hello, bakery!\n")
    assert cadence("agents", "apply", str(agent_file), "--url", url).stdout.strip() == "created agent bakery"
    agent_file.write_text("name: bakery\nsystem_prompt: You take cake orders.\n")
    assert cadence("agents", "apply", str(agent_file), "--url", url).stdout.strip() == "replaced agent bakery"
    listed = cadence("agents", "list", "--url", url).stdout.splitlines()
    assert listed == ["default\tfile (default)", "bakery\tapi"]
    assert "You take cake orders." in cadence("agents", "show", "bakery", "--url", url).stdout

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "menu.md").write_text("# Menu\nSourdough costs five dollars.\n")
    (tmp_path / "docs" / "notes.txt").write_bytes(b"\xff\xfe not utf-8 \x80")
    ingested = cadence("ingest", "bakery", str(tmp_path / "docs"), "--quiet", "--url", url)
    assert ingested.returncode == 1, "one file failed, so the command fails"
    assert "menu.md" in ingested.stdout and "notes.txt" in ingested.stdout + ingested.stderr

    out = io.StringIO()
    assert agents_cli.chat(url, "bakery", show_passages=True, stdin=io.StringIO("how much is sourdough\n\n"),
                           out=out) == 0
    assert "We open at eight." in out.getvalue() and "menu.md" in out.getvalue()


@pytest.mark.slow
def test_bad_files_and_unknown_agents_get_a_clear_message_and_a_nonzero_exit(url, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nsystem_prompt: p\nllm: {top_p: 9}\n")
    applied = cadence("agents", "apply", str(bad), "--url", url)
    assert applied.returncode == 1 and "llm.top_p must be in (0, 1]" in applied.stderr
    shown = cadence("agents", "show", "ghost", "--url", url)
    assert shown.returncode == 1 and "404" in shown.stderr and "no agent 'ghost'" in shown.stderr
    chatted = cadence("chat", "ghost", "--url", url, stdin="hello\n")
    assert chatted.returncode == 1 and "no agent 'ghost'" in chatted.stderr
    unreachable = cadence("agents", "list", "--url", "http://127.0.0.1:9")
    assert unreachable.returncode == 2 and "cannot reach" in unreachable.stderr


def test_serve_refuses_a_public_address_without_keys(monkeypatch, capsys):
    from agent import cli

    monkeypatch.delenv("CADENCE_API_KEYS", raising=False)
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2  # refused before anything binds
    err = capsys.readouterr().err
    assert "refusing to listen on '0.0.0.0' without API keys" in err and "--insecure" in err
    monkeypatch.setenv("CADENCE_API_KEYS", "short")
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2  # a bad key is a config error
    assert "shorter than 16" in capsys.readouterr().err


def test_the_servers_log_keeps_pipecats_warnings_but_the_stop_secs_advice_that_does_not_apply():
    script = ("from agent.cli import _quiet_loguru; from loguru import logger; _quiet_loguru('info'); "
              "logger.warning('EagerSpeechTimeoutStopStrategy#0: VAD stop_secs (1.0s) differs from the recommended "
              "default (0.2s).'); logger.warning('a real warning'); logger.debug('a frame went by')")
    logged = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                            check=True).stderr
    assert "a real warning" in logged
    assert "stop_secs" not in logged and "a frame went by" not in logged


def test_a_model_failure_the_server_handles_is_not_logged_as_an_error_twice_over():
    script = ("from agent.cli import _quiet_loguru; from loguru import logger; _quiet_loguru('info')\n"
              "def push_error_frame(message):\n    logger.error(message)\n"
              "push_error_frame('EngineLLMService#0 exception (models/stalls.py:73): LLM unavailable: LLM reply: "
              "no first answer within 6.0 s')\n"
              "push_error_frame('EngineSTTService#0 error: speech recognition unavailable: no transcript within 4.7 s')\n"
              "logger.warning('PipelineWorker#0: Something went wrong: ErrorFrame#0(error: LLM unavailable: LLM reply: "
              "no first answer within 6.0 s)')\n"
              "push_error_frame('EngineLLMService#0 error: something no one handles')\n"
              "logger.error('LLM unavailable: logged elsewhere, kept')")
    logged = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                            check=True).stderr
    errors = [line for line in logged.splitlines() if "| ERROR" in line]
    assert len(errors) == 2 and "something no one handles" in errors[0] and "kept" in errors[1], logged
    assert "Something went wrong: ErrorFrame#0(error: LLM unavailable" in logged  # still told, at WARNING
