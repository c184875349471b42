"""`cadence agents list|show|apply` and `cadence chat`: the agents API from a terminal.

They talk to a running server over HTTP (`--url`), so what they do is exactly what the
API does, validation included. `apply FILE` creates the agent a YAML or JSON file
defines, or replaces it if it exists (API agents only: file agents live in agents.dir).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml

TIMEOUT = httpx.Timeout(10.0, read=120.0)  # a chat reply on a busy CPU can take a while


def _fail(response: httpx.Response, out: TextIO) -> int:
    try:
        message = response.json().get("error", response.text)
    except ValueError:
        message = response.text
    print(f"cadence: {response.status_code}: {message}", file=out)
    return 1


def list_agents(url: str, out: TextIO = sys.stdout, headers: dict[str, str] | None = None) -> int:
    response = httpx.get(f"{url}/api/agents", timeout=TIMEOUT, headers=headers)
    if response.status_code != 200:
        return _fail(response, sys.stderr)
    for agent in response.json()["agents"]:
        mark = " (default)" if agent.get("default") else ""
        print(f"{agent['name']}\t{agent['source']}{mark}", file=out)
    return 0


def show_agent(url: str, name: str, out: TextIO = sys.stdout, headers: dict[str, str] | None = None) -> int:
    response = httpx.get(f"{url}/api/agents/{name}", timeout=TIMEOUT, headers=headers)
    if response.status_code != 200:
        return _fail(response, sys.stderr)
    print(yaml.safe_dump(response.json(), sort_keys=False, allow_unicode=True), end="", file=out)
    return 0


def apply_agent(url: str, path: str, out: TextIO = sys.stdout, headers: dict[str, str] | None = None) -> int:
    try:
        data: Any = yaml.safe_load(Path(path).read_text())  # YAML is a superset of JSON
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        print(f"cadence: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        print(f"cadence: {path} must define an agent with a name", file=sys.stderr)
        return 2
    name = data["name"]
    exists = httpx.get(f"{url}/api/agents/{name}", timeout=TIMEOUT, headers=headers).status_code == 200
    response = (httpx.put(f"{url}/api/agents/{name}", json=data, timeout=TIMEOUT, headers=headers) if exists
                else httpx.post(f"{url}/api/agents", json=data, timeout=TIMEOUT, headers=headers))
    if response.status_code not in (200, 201):
        return _fail(response, sys.stderr)
    print(f"{'replaced' if exists else 'created'} agent {name}", file=out)
    return 0


def stream_chat(url: str, name: str, message: str, history: list[dict[str, str]], out: TextIO,
                headers: dict[str, str] | None = None) -> dict | None:
    """Prints the reply as it streams; returns the final event, or None after an error."""
    with httpx.stream("POST", f"{url}/api/agents/{name}/chat", json={"message": message, "history": history},
                      timeout=TIMEOUT, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            _fail(response, sys.stderr)
            return None
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: "):])
            if event["type"] == "delta":
                print(event["text"], end="", flush=True, file=out)
            elif event["type"] == "error":
                print(f"\ncadence: {event['error']}", file=sys.stderr)
                return None
            elif event["type"] == "done":
                print(file=out)
                return event
    return None


def chat(url: str, name: str, *, show_passages: bool = False, stdin: TextIO = sys.stdin,
         out: TextIO = sys.stdout, headers: dict[str, str] | None = None) -> int:
    """A conversation in the terminal: a line in, the agent's reply out; an empty line or EOF ends it."""
    history: list[dict[str, str]] = []
    interactive = stdin.isatty()
    while True:
        if interactive:
            print("you> ", end="", flush=True, file=out)
        line = stdin.readline()
        if not line or not line.strip():
            return 0
        if interactive:
            print(f"{name}> ", end="", flush=True, file=out)
        done = stream_chat(url, name, line.strip(), history, out, headers)
        if done is None:
            return 1
        if show_passages:
            for passage in done["passages"]:
                print(f"  [{passage['source']}#{passage['chunk_id']} {passage['score']:.3f}] "
                      f"{passage['text'][:100]}", file=out)
        history += [{"role": "user", "content": line.strip()}, {"role": "assistant", "content": done["reply"]}]
