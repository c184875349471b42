"""`cadence workers up`: a deployment's workers as real processes, ready, stopped on SIGTERM."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from agent.model_plane import free_port_run

pytestmark = pytest.mark.slow


def test_workers_up_starts_the_deployment_and_stops_it_on_sigterm(tmp_path):
    deployment = tmp_path / "llm.yaml"
    deployment.write_text(yaml.safe_dump({"name": "llm-only", "workers": {"llm": {
        "engine": "llama-server", "model": "package:smollm2-135m-instruct", "threads": 1,
        "max_streams": 2, "context_tokens_per_stream": 512}}}))
    port = free_port_run(2)
    process = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "workers", "up", "--deployment", str(deployment),
         "--base-port", str(port), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "up.log", "w"), text=True, start_new_session=True)
    try:
        line = process.stdout.readline()  # its first line says the workers are ready; EOF if it failed
        assert f"ready at http://127.0.0.1:{port}" in line, (line, (tmp_path / "up.log").read_text()[-2000:])
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_workers_up_refuses_a_deployment_that_does_not_fit(tmp_path):
    deployment = tmp_path / "gpu.yaml"
    deployment.write_text(yaml.safe_dump({"name": "gpu", "workers": {"asr": {
        "engine": "faster-whisper", "model": "large-v3", "device": "1g.10gb#0",
        "memory": {"weights_gb": 3.0}}}}))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "agent.cli", "workers", "up", "--deployment", str(deployment)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 2 and "1g.10gb#0" in done.stderr
    assert time.monotonic() - started < 60
