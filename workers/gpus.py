"""What GPUs and MIG slices this machine has, from `nvidia-smi -L` (and NVML, where it imports).

`nvidia-smi -L` lists each GPU and, indented under it, its MIG devices in the order CUDA
numbers them:

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
      MIG 1g.10gb     Device  0: (UUID: MIG-c7384736-a75d-5afc-978f-d2f1294409fd)

Parsing is a pure function; `discover` runs the command. Memory comes from NVML when the
`nvidia-ml-py` package is installed (what the driver really gives a slice), otherwise from
the profile name (`1g.10gb` -> 10 GB), which rounds up: plans should leave headroom.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)\s]+)\)\s*$")
# "MIG 1g.10gb     Device  0: (UUID: MIG-...)"; drivers before R470 printed MIG-GPU-<uuid>/<gi>/<ci>.
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)\s*$")
_PROFILE_MEMORY = re.compile(r"(\d+)gb")  # 1g.10gb, 1g.10gb+me, 1c.3g.40gb (compute instance)
_NAME_MEMORY = re.compile(r"(\d+)\s*GB\b")  # "NVIDIA H100 80GB HBM3"
# Boards whose name in nvidia-smi carries no size ("NVIDIA H200", "NVIDIA H200 NVL").
_BOARD_MEMORY_GB = {"H200": 141.0, "H100 PCIe": 80.0}
_NVIDIA_SMI_TIMEOUT_S = 30.0  # it answers in well under a second; a hung driver must not hang us
_BYTES_PER_GB = float(1 << 30)


@dataclass(frozen=True)
class MigSlice:
    uuid: str  # MIG-<uuid>: what CUDA_VISIBLE_DEVICES takes
    profile: str  # e.g. 1g.10gb: compute slices and memory
    gpu_index: int  # the GPU it is carved from
    device_index: int  # its "Device N" within that GPU, in CUDA's order
    memory_gb: float | None  # NVML's total, else the profile name's figure

    def label(self) -> str:
        return f"{self.profile} on GPU {self.gpu_index} ({self.uuid})"


@dataclass(frozen=True)
class Gpu:
    index: int  # nvidia-smi's index, PCI bus order
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    uuid: str  # GPU-<uuid>
    memory_gb: float | None  # the whole board's memory; None when nothing says
    slices: tuple[MigSlice, ...] = ()  # MIG devices; empty when MIG is off

    @property
    def mig_enabled(self) -> bool:
        return bool(self.slices)


def parse_nvidia_smi_list(text: str) -> tuple[Gpu, ...]:
    """GPUs and their MIG slices from `nvidia-smi -L`; other lines ("No devices were found") are ignored."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            index, name, uuid = int(gpu.group(1)), gpu.group(2).strip(), gpu.group(3)
            gpus.append(Gpu(index, name, uuid, _board_memory_gb(name)))
            continue
        mig = _MIG_LINE.match(line)
        if mig and gpus:
            parent = gpus[-1]
            piece = MigSlice(mig.group(3), mig.group(1), parent.index, int(mig.group(2)),
                             profile_memory_gb(mig.group(1)))
            gpus[-1] = replace(parent, slices=parent.slices + (piece,))
    return tuple(gpus)


def profile_memory_gb(profile: str) -> float | None:
    found = _PROFILE_MEMORY.search(profile)
    return float(found.group(1)) if found else None


def _board_memory_gb(name: str) -> float | None:
    found = _NAME_MEMORY.search(name)
    if found:
        return float(found.group(1))
    for board, memory in _BOARD_MEMORY_GB.items():
        if board in name:
            return memory
    return None


def with_memory(gpus: tuple[Gpu, ...], memory_by_uuid: Mapping[str, float]) -> tuple[Gpu, ...]:
    """The same GPUs with measured memory (by GPU- or MIG- uuid) where there is a measurement."""
    def measured(uuid: str, fallback: float | None) -> float | None:
        return memory_by_uuid.get(uuid, fallback)

    return tuple(
        replace(gpu, memory_gb=measured(gpu.uuid, gpu.memory_gb),
                slices=tuple(replace(s, memory_gb=measured(s.uuid, s.memory_gb)) for s in gpu.slices))
        for gpu in gpus)


def discover(run: Callable[..., subprocess.CompletedProcess] = subprocess.run, *,
             read_memory: Callable[[], Mapping[str, float]] | None = None) -> tuple[Gpu, ...]:
    """This machine's GPUs. No nvidia-smi on PATH, or one that fails, means no GPU."""
    try:
        done = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if done.returncode != 0:  # e.g. 6 with "No devices were found", 9 without a driver
        return ()
    gpus = parse_nvidia_smi_list(done.stdout)
    if not gpus:
        return ()
    return with_memory(gpus, (read_memory or nvml_memory_gb)())


def nvml_memory_gb() -> dict[str, float]:
    """Total memory per GPU and MIG uuid from NVML; empty without `nvidia-ml-py` or a driver."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    totals: dict[str, float] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
            _record(pynvml, gpu, totals)
            for mig in _mig_handles(pynvml, gpu):
                _record(pynvml, mig, totals)
    except pynvml.NVMLError:
        pass  # what was read stays; the rest falls back to profile names
    finally:
        pynvml.nvmlShutdown()
    return totals


def _mig_handles(pynvml, gpu) -> list:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(gpu)
    except pynvml.NVMLError:  # not a MIG-capable board
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    handles = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index))
        except pynvml.NVMLError:  # NOT_FOUND: no device at this index
            continue
    return handles


def _record(pynvml, handle, totals: dict[str, float]) -> None:
    try:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    except pynvml.NVMLError:
        return
    totals[uuid.decode() if isinstance(uuid, bytes) else uuid] = total / _BYTES_PER_GB
