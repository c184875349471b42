"""Where agents live: YAML files under `agents.dir` and the SQLite store behind the API.

File agents are loaded once at start and are read-only over HTTP (their file is their
source of truth: an API edit would be lost at the next restart, so it is refused with
409). API agents live in the store and in a cache here, so a call's agent lookup costs
no disk read. A call resolves its agent once, when it starts (`agent.agents.resolve`):
what happens to the definition afterwards never reaches that call.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from agent.agents import (AgentLimits, AgentSpec, check_against_server, compact, merge_patch, parse_spec,
                          resolve)
from agent.config import CadenceConfig
from agent.errors import ConfigError, ConflictError, NotFoundError
from agent.store import CallStore
from models.config_loader import read_yaml
from pipelines.call_agent import CallAgent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileAgent:
    spec: AgentSpec
    path: Path
    data: dict[str, Any]  # as written in the file

    def knowledge_paths(self) -> list[Path]:
        """The documents the file names, relative to it; a glob may name several."""
        paths: list[Path] = []
        for pattern in self.spec.knowledge_files:
            matches = sorted(self.path.parent.glob(pattern))
            if not matches:
                raise ConfigError(f"{self.path}: knowledge_files entry {pattern!r} matches no file")
            paths += [m for m in matches if m.is_file()]
        return paths


def limits_of(config: CadenceConfig) -> AgentLimits:
    return AgentLimits(max_prompt_chars=config.agents.max_prompt_chars,
                       max_greeting_chars=config.agents.max_greeting_chars)


def load_agent_files(config: CadenceConfig, *, llm_context_tokens: int | None = None) -> dict[str, FileAgent]:
    """Every *.yaml under agents.dir. A bad file stops startup: ConfigError names it and the field
    (a prompt too long for `llm_context_tokens` too, where that is known)."""
    folder = Path(config.agents.dir)
    if not folder.is_dir():
        raise ConfigError(f"agents.dir {folder} is not a directory")
    agents: dict[str, FileAgent] = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        data = read_yaml(path, "agent")
        spec = parse_spec(data, limits_of(config), where=str(path))
        check_against_server(spec, config, where=str(path), llm_context_tokens=llm_context_tokens)
        if spec.name in agents:
            raise ConfigError(f"{path}: agent {spec.name!r} is already defined in {agents[spec.name].path}")
        agents[spec.name] = FileAgent(spec=spec, path=path, data=data)
        agents[spec.name].knowledge_paths()  # a missing document stops startup too
    if config.agents.default not in agents:
        raise ConfigError(f"agents.default {config.agents.default!r} has no file in {folder} "
                          f"(found: {sorted(agents) or 'none'})")
    return agents


class AgentRegistry:
    def __init__(self, config: CadenceConfig, store: CallStore, files: dict[str, FileAgent],
                 clock: Callable[[], float] = time.time, *, llm_context_tokens: int | None = None) -> None:
        """`llm_context_tokens`: one call's context at the LLM engine (None: not known): an agent
        whose prompt leaves no room for a dialogue in it is refused, and each call's dialogue
        gets what its agent's prompt leaves."""
        self._config = config
        self._llm_context_tokens = llm_context_tokens
        self._store = store
        self._files = files
        self._clock = clock
        self._api: dict[str, tuple[AgentSpec, dict[str, Any]]] = {}  # name -> (spec, as given)

    @property
    def files(self) -> dict[str, FileAgent]:
        return self._files

    async def open(self) -> None:
        """Loads the API agents from the store; one that no longer fits this server (its
        voice is gone from the config) is kept but logged, and calls to it are refused."""
        for row in await self._store.list_agents():
            try:
                spec = parse_spec(row["spec"], limits_of(self._config), where=f"stored agent {row['name']}")
            except ConfigError as exc:
                log.error("stored agent %s is invalid and unavailable: %s", row["name"], exc)
                continue
            self._api[spec.name] = (spec, row["spec"])

    def names(self) -> list[str]:
        return sorted({*self._files, *self._api})

    def exists(self, name: str) -> bool:
        return name in self._files or name in self._api

    def spec(self, name: str) -> AgentSpec:
        if name in self._files:
            return self._files[name].spec
        if name in self._api:
            return self._api[name][0]
        raise NotFoundError(f"no agent {name!r}; GET /api/agents lists them")

    def for_call(self, name: str | None) -> CallAgent:
        """The concrete agent a new call runs with (the default agent if it names none)."""
        spec = self.spec(name or self._config.agents.default)
        check_against_server(spec, self._config, llm_context_tokens=self._llm_context_tokens)
        return resolve(spec, self._config, llm_context_tokens=self._llm_context_tokens)

    def describe(self, name: str) -> dict[str, Any]:
        """What the API shows: the definition as given, its source, and what calls get."""
        spec = self.spec(name)
        source = f"file:{self._files[name].path}" if name in self._files else "api"
        given = self._files[name].data if name in self._files else self._api[name][1]
        resolved = resolve(spec, self._config, llm_context_tokens=self._llm_context_tokens)
        return {"name": name, "source": source, "spec": given, "resolved": _resolved_dict(resolved)}

    def list(self) -> list[dict[str, Any]]:
        default = self._config.agents.default
        names = sorted(self.names(), key=lambda n: (n != default, n))  # the default agent first
        return [{"name": n, "source": "file" if n in self._files else "api", "default": n == default}
                for n in names]

    async def create(self, data: Any) -> AgentSpec:
        spec = self._validate(data)
        if self.exists(spec.name):
            raise ConflictError(f"agent {spec.name!r} already exists; PUT /api/agents/{spec.name} replaces it")
        if len(self._api) >= self._config.agents.max_agents:
            raise ConflictError(f"this server holds its limit of {self._config.agents.max_agents} API agents")
        given = compact(spec.to_dict())
        if not await self._store.save_agent(spec.name, given, self._clock(), create=True):
            raise ConflictError(f"agent {spec.name!r} already exists")
        self._api[spec.name] = (spec, given)
        return spec

    async def replace(self, name: str, data: Any) -> AgentSpec:
        self._writable(name)
        if isinstance(data, dict) and "name" not in data:
            data = {**data, "name": name}
        spec = self._validate(data)
        if spec.name != name:
            raise ConfigError(f"agent.name {spec.name!r} differs from the URL's {name!r}; renaming is not supported")
        given = compact(spec.to_dict())
        if not await self._store.save_agent(name, given, self._clock(), create=False):
            raise NotFoundError(f"no agent {name!r}")
        self._api[name] = (spec, given)
        return spec

    async def patch(self, name: str, data: Any) -> AgentSpec:
        self._writable(name)
        if not isinstance(data, dict):
            raise ConfigError("a PATCH body must be a JSON object (JSON Merge Patch)")
        return await self.replace(name, merge_patch(self._api[name][1], data))

    async def delete(self, name: str) -> None:
        """Calls in progress keep their resolved agent and go on."""
        self._writable(name)
        await self._store.delete_agent(name)
        self._api.pop(name, None)

    def _writable(self, name: str) -> None:
        if name in self._files:
            raise ConflictError(f"agent {name!r} is defined in {self._files[name].path}; edit that file instead")
        if name not in self._api:
            raise NotFoundError(f"no agent {name!r}; GET /api/agents lists them")

    def _validate(self, data: Any) -> AgentSpec:
        spec = parse_spec(data, limits_of(self._config))
        if spec.knowledge_files:
            raise ConfigError("agent.knowledge_files is for YAML agents; upload documents to "
                              "POST /api/agents/{name}/knowledge")
        check_against_server(spec, self._config, llm_context_tokens=self._llm_context_tokens)
        return spec


def _resolved_dict(agent: CallAgent) -> dict[str, Any]:
    return dataclasses.asdict(agent)
