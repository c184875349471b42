"""A deployment placed on this machine's GPUs: every worker (and replica) resolved to a device,
an environment, a port and a command line; or refused, with every problem listed at once.

Pure: the GPUs, the binary lookup and the model resolver come in as arguments. A plan is
refused when a named slice is missing, when two workers land on one slice without both
saying `share_slice: true`, when what is planned on a slice exceeds its memory, or when a
worker asks for a GPU the machine does not have.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from models.errors import CadenceError, ConfigError
from workers.deployment import Deployment, WorkerSpec
from workers.gpus import Gpu, MigSlice
from workers.launch import LaunchSite, WorkerLaunch, build_launch

DEFAULT_BASE_PORT = 8100
_CUDA = re.compile(r"^cuda:(\d+)$")
_PROFILE_INDEX = re.compile(r"^(.+)#(\d+)$")


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu", "cuda:N" or "MIG-<uuid>"
    visible_devices: str  # CUDA_VISIBLE_DEVICES for it ("" hides every GPU)
    memory_gb: float | None  # the GPU's or slice's memory; None on CPU
    described: str  # for people: "1g.10gb#3 = 1g.10gb on GPU 0 (MIG-...)"

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"


@dataclass(frozen=True)
class PlannedWorker:
    name: str  # the worker's name, "-<i>" per replica when replicas > 1
    spec: WorkerSpec  # as the deployment describes it
    placement: Placement | None  # None for external workers
    planned_memory_gb: float | None  # what it is planned to use on its device
    launch: WorkerLaunch | None  # process workers only: in-process and external ones start no process
    url: str | None  # where it answers: the launch's base URL, or an external worker's url


@dataclass(frozen=True)
class Plan:
    deployment: Deployment  # what was asked for
    gpus: tuple[Gpu, ...]  # what this machine has
    workers: tuple[PlannedWorker, ...]  # in deployment order, replicas together

    @property
    def launches(self) -> tuple[WorkerLaunch, ...]:
        return tuple(w.launch for w in self.workers if w.launch is not None)


def _model_as_given(reference: str) -> str | None:
    return None if reference.startswith("package:") else reference


def plan(deployment: Deployment, gpus: tuple[Gpu, ...], *,
         find_binary: Callable[[str], str | None] = shutil.which,
         resolve_model: Callable[[str], object | None] = _model_as_given,
         base_port: int = DEFAULT_BASE_PORT) -> Plan:
    """Places every worker; raises ConfigError listing all problems when it cannot."""
    problems: list[str] = []
    placed: list[tuple[str, WorkerSpec, Placement | None]] = []
    troubled: set[str] = set()  # workers already refused: building their launch would repeat it
    for spec in deployment.workers:
        if spec.run == "external":
            placed.append((spec.name, spec, None))
            continue
        for name, device in _replicas(spec):
            try:
                placement = resolve_device(device, gpus)
            except ConfigError as exc:
                problems.append(f"{name}: {exc}")
                continue
            own = _worker_problems(name, spec, placement)
            problems += own
            troubled.update([name] if own else [])
            placed.append((name, spec, placement))
    problems += _slice_problems(placed)
    ports, port_problems = _ports(placed, base_port)
    problems += port_problems
    workers = []
    for name, spec, placement in placed:
        if name in troubled:
            continue
        try:
            workers.append(_planned(name, spec, placement, ports.get(name), deployment, find_binary, resolve_model))
        except CadenceError as exc:  # ConfigError from the launcher, ModelAssetError from the resolver
            problems.append(str(exc) if str(exc).startswith(name) else f"{name}: {exc}")
    if problems:
        raise ConfigError(f"deployment {deployment.name} ({deployment.source}) cannot run on this machine "
                          f"({describe_machine(gpus)}):\n" + "\n".join(f"  - {p}" for p in problems))
    return Plan(deployment, gpus, tuple(workers))


def _replicas(spec: WorkerSpec) -> list[tuple[str, str]]:
    """(replica name, device) pairs; a single <profile>#<i> steps to #i+1, #i+2 per replica."""
    names = [spec.name] if spec.replicas == 1 else [f"{spec.name}-{i}" for i in range(spec.replicas)]
    if len(spec.devices) == spec.replicas:
        return list(zip(names, spec.devices))
    device = spec.devices[0]
    profile = _PROFILE_INDEX.match(device)
    if profile is None:
        return [(name, device) for name in names]
    first = int(profile.group(2))
    return [(name, f"{profile.group(1)}#{first + i}") for i, name in enumerate(names)]


def resolve_device(device: str, gpus: tuple[Gpu, ...]) -> Placement:
    """The placement of one device string on these GPUs; ConfigError saying what exists if none."""
    if device == "cpu":
        return Placement("cpu", "", None, "cpu")
    if not gpus:
        raise ConfigError(f"device {device} asks for a GPU, but this machine has none "
                          "(nvidia-smi missing or finds no devices): use device: cpu, or run it on a GPU host")
    cuda = _CUDA.match(device)
    if cuda:
        return _whole_gpu(int(cuda.group(1)), gpus)
    slices = [s for gpu in gpus for s in gpu.slices]
    if device.startswith("MIG-"):
        for piece in slices:
            if piece.uuid == device:
                return _slice_placement(piece, piece.label())
        raise ConfigError(f"no MIG slice {device} on this machine; it has: {_slice_list(slices)}")
    profile, index = _PROFILE_INDEX.match(device).groups()  # the loader checked the syntax
    of_profile = [s for s in slices if s.profile == profile]
    if int(index) >= len(of_profile):
        have = f"{len(of_profile)} ({profile}#0..#{len(of_profile) - 1})" if of_profile else "none"
        raise ConfigError(f"device {device}: slices of profile {profile} on this machine: {have}; "
                          f"it has: {_profile_counts(slices)}")
    piece = of_profile[int(index)]
    return _slice_placement(piece, f"{device} = {piece.label()}")


def _whole_gpu(index: int, gpus: tuple[Gpu, ...]) -> Placement:
    if index >= len(gpus):
        raise ConfigError(f"device cuda:{index}: this machine has {len(gpus)} GPU(s), cuda:0..cuda:{len(gpus) - 1}")
    gpu = gpus[index]
    if gpu.mig_enabled:  # CUDA sees no device when given a whole GPU in MIG mode
        raise ConfigError(f"device cuda:{index}: GPU {index} is in MIG mode; name one of its slices "
                          f"({_profile_counts(gpu.slices)}) as <profile>#<i> or MIG-<uuid>")
    return Placement(f"cuda:{index}", str(index), gpu.memory_gb, f"cuda:{index} = GPU {index} {gpu.name} ({gpu.uuid})")


def _slice_placement(piece: MigSlice, described: str) -> Placement:
    return Placement(piece.uuid, piece.uuid, piece.memory_gb, described)


def _worker_problems(name: str, spec: WorkerSpec, placement: Placement) -> list[str]:
    if not placement.on_gpu:
        return []
    problems = []
    if spec.memory is None:
        problems.append(f"{name}: on {placement.device} it needs memory: {{weights_gb, kv_cache_gb_per_stream, "
                        "overhead_gb}, so the plan can check that it fits")
    if spec.run == "in-process" and placement.device.startswith("MIG-"):
        problems.append(f"{name}: an in-process worker cannot have a MIG slice (the agent process sees at most "
                        "one); use run: process")
    return problems


def _slice_problems(placed: list[tuple[str, WorkerSpec, Placement | None]]) -> list[str]:
    """Two workers on one GPU or slice only when both share; never more than its memory."""
    by_device: dict[str, list[tuple[str, WorkerSpec, Placement]]] = {}
    for name, spec, placement in placed:
        if placement is not None and placement.on_gpu:
            by_device.setdefault(placement.device, []).append((name, spec, placement))
    problems = []
    for tenants in by_device.values():
        placement = tenants[0][2]
        names = ", ".join(name for name, _, _ in tenants)
        if len(tenants) > 1 and not all(spec.share_slice for _, spec, _ in tenants):
            problems.append(f"{names} are all on {placement.described}: give each its own slice, "
                            "or set share_slice: true on every one of them")
        planned = [(name, spec) for name, spec, _ in tenants if spec.memory is not None]
        total = sum(spec.planned_memory_gb() for _, spec in planned)
        if placement.memory_gb is not None and total > placement.memory_gb:
            sums = "; ".join(f"{name}: {_memory_sum(spec)}" for name, spec in planned)
            problems.append(f"{names} plan {total:.2f} GB on {placement.described}, which has "
                            f"{placement.memory_gb:.1f} GB ({sums}): lower max_streams or "
                            "context_tokens_per_stream, or use a larger slice")
    return problems


def _memory_sum(spec: WorkerSpec) -> str:
    memory = spec.memory
    assert memory is not None
    return (f"weights {memory.weights_gb:g} + KV {memory.kv_cache_gb_per_stream:g} x {spec.max_streams} streams "
            f"+ overhead {memory.overhead_gb:g} = {spec.planned_memory_gb():.2f}")


def _ports(placed: list[tuple[str, WorkerSpec, Placement | None]], base_port: int) -> tuple[dict[str, int], list[str]]:
    """Fixed ports as given; the rest base_port, base_port + 1, ... skipping fixed ones."""
    launched = [(name, spec) for name, spec, _ in placed if spec.run == "process"]
    fixed: dict[int, str] = {}
    problems = []
    for name, spec in launched:
        if spec.port is not None:
            if spec.port in fixed:
                problems.append(f"{name}: port {spec.port} is also {fixed[spec.port]}'s; give each its own")
            fixed.setdefault(spec.port, name)
    ports = {name: spec.port for name, spec in launched if spec.port is not None}
    candidate = base_port
    for name, spec in launched:
        if spec.port is None:
            while candidate in fixed:
                candidate += 1
            ports[name] = candidate
            candidate += 1
    return ports, problems


def _planned(name: str, spec: WorkerSpec, placement: Placement | None, port: int | None, deployment: Deployment,
             find_binary: Callable[[str], str | None], resolve_model: Callable[[str], object | None]) -> PlannedWorker:
    if placement is None:
        return PlannedWorker(name, spec, None, spec.planned_memory_gb(), None, spec.url)
    launch = None
    if spec.run == "process":
        assert port is not None
        site = LaunchSite(spec, name, placement.device, placement.memory_gb, device_environment(spec, placement),
                          deployment.host, port, deployment.source)
        launch = build_launch(site, find_binary=find_binary, resolve_model=resolve_model)
    return PlannedWorker(name, spec, placement, spec.planned_memory_gb(), launch,
                         launch.base_url if launch else None)


def device_environment(spec: WorkerSpec, placement: Placement) -> Mapping[str, str]:
    """Set before the worker touches CUDA: it then sees its own device and nothing else."""
    env = {"CUDA_VISIBLE_DEVICES": placement.visible_devices, "OMP_NUM_THREADS": str(spec.threads)}
    if placement.device.startswith("cuda:"):
        # CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi's index is PCI order.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def describe_machine(gpus: tuple[Gpu, ...]) -> str:
    if not gpus:
        return "no GPU"
    return "; ".join(f"GPU {g.index} {g.name}" + (f" with {_profile_counts(g.slices)}" if g.slices else "")
                     for g in gpus)


def _profile_counts(slices: tuple[MigSlice, ...] | list[MigSlice]) -> str:
    counts: dict[str, int] = {}
    for piece in slices:
        counts[piece.profile] = counts.get(piece.profile, 0) + 1
    return ", ".join(f"{count} x {profile}" for profile, count in counts.items()) or "no MIG slices"


def _slice_list(slices: list[MigSlice]) -> str:
    return ", ".join(s.uuid for s in slices) or "no MIG slices"
