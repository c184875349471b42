"""Deployments as config and `cadence workers plan`: GPUs read from a real-format `nvidia-smi -L`
(a fake executable on PATH prints a captured listing), workers placed on MIG slices, and every
refusal reported with the worker's name and what to do."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from models.errors import ConfigError
from workers.deployment import load_deployment, parse_deployment
from workers.gpus import discover, parse_nvidia_smi_list
from workers.placement import plan
from workers.plan_cli import main

ROOT = Path(__file__).resolve().parent.parent
LISTINGS = ROOT / "tests" / "fixtures" / "nvidia_smi"
DEPLOYMENTS = ROOT / "configs" / "deployments"
CAT = shutil.which("cat")


def listing(name: str) -> str:
    return (LISTINGS / name).read_text()


def slice_uuids(name: str) -> list[str]:
    return [s.uuid for gpu in parse_nvidia_smi_list(listing(name)) for s in gpu.slices]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """PATH holds only a fake `nvidia-smi` (printing a captured listing) and a fake llama-server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    llama = bin_dir / "llama-server"
    llama.write_text("#!/bin/sh\nexit 0\n")
    llama.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("CADENCE_LLAMA_SERVER", str(llama))

    class Machine:
        llama_server = str(llama)

        @staticmethod
        def has(fixture: str | None, exit_code: int = 0) -> None:
            smi = bin_dir / "nvidia-smi"
            if fixture is None:
                smi.unlink(missing_ok=True)
                return
            smi.write_text(f"#!/bin/sh\n{CAT} '{LISTINGS / fixture}'\nexit {exit_code}\n")
            smi.chmod(0o755)

    return Machine()


def run_plan(capsys, deployment: Path, *flags: str) -> tuple[int, str, str]:
    code = main(["--deployment", str(deployment), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def planned(capsys, deployment: Path) -> dict[str, dict]:
    code, out, err = run_plan(capsys, deployment, "--json")
    assert code == 0, err
    return {worker["name"]: worker for worker in json.loads(out)["workers"]}


def write_deployment(tmp_path: Path, workers: dict, name: str = "test") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "workers": workers}))
    return path


def gpu_worker(device: str, **settings) -> dict:
    return {"engine": "vllm", "role": "llm", "model": "org/model", "device": device, "max_streams": 4,
            "memory": {"weights_gb": 4.0, "kv_cache_gb_per_stream": 0.25, "overhead_gb": 1.0}, **settings}


# --- reading nvidia-smi -------------------------------------------------------------------


@pytest.mark.parametrize("fixture, board, board_gb, profiles", [
    ("h100_7x1g.10gb.txt", "NVIDIA H100 80GB HBM3", 80.0, ["1g.10gb"] * 7),
    ("h100_mixed.txt", "NVIDIA H100 80GB HBM3", 80.0, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
    ("h200_7x1g.18gb.txt", "NVIDIA H200", 141.0, ["1g.18gb"] * 7),
    ("h100_whole.txt", "NVIDIA H100 80GB HBM3", 80.0, []),
])
def test_listing_parses_into_gpus_and_slices_with_memory_from_the_profile(fixture, board, board_gb, profiles):
    (gpu,) = parse_nvidia_smi_list(listing(fixture))
    assert (gpu.index, gpu.name, gpu.memory_gb, gpu.mig_enabled) == (0, board, board_gb, bool(profiles))
    assert [s.profile for s in gpu.slices] == profiles
    assert [s.device_index for s in gpu.slices] == list(range(len(profiles)))
    assert [s.memory_gb for s in gpu.slices] == [float(p.split(".")[1][:-2]) for p in profiles]
    assert all(s.uuid.startswith("MIG-") and len(s.uuid) == 40 for s in gpu.slices)


def test_listing_without_devices_and_older_drivers_formats():
    assert parse_nvidia_smi_list(listing("no_devices.txt")) == ()
    older = ("GPU 0: A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
             "  MIG 1g.5gb+me  Device  0: (UUID: MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0)\n")
    (gpu,) = parse_nvidia_smi_list(older)
    assert (gpu.memory_gb, gpu.slices[0].profile, gpu.slices[0].memory_gb) == (40.0, "1g.5gb+me", 5.0)
    assert gpu.slices[0].uuid == "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0"


def test_discover_runs_nvidia_smi_from_path(machine):
    machine.has("h100_7x1g.10gb.txt")
    (gpu,) = discover()
    assert [s.uuid for s in gpu.slices] == slice_uuids("h100_7x1g.10gb.txt")


@pytest.mark.parametrize("fixture, exit_code", [(None, 0), ("no_devices.txt", 6), ("no_devices.txt", 0)])
def test_discover_finds_no_gpu_without_nvidia_smi_or_devices(machine, fixture, exit_code):
    machine.has(fixture, exit_code)
    assert discover() == ()


def test_discover_takes_memory_from_nvml_where_it_answers(machine):
    machine.has("h100_mixed.txt")
    first = slice_uuids("h100_mixed.txt")[0]
    (gpu,) = discover(read_memory=lambda: {first: 39.5})
    assert [s.memory_gb for s in gpu.slices] == [39.5, 20.0, 10.0, 10.0]


# --- the shipped deployments --------------------------------------------------------------


def test_h100_deployment_pins_each_worker_to_its_own_slice(machine, capsys):
    machine.has("h100_7x1g.10gb.txt")
    uuids = slice_uuids("h100_7x1g.10gb.txt")
    workers = planned(capsys, DEPLOYMENTS / "h100-mig.yaml")
    expected = {"llm": 0, "tts-0": 1, "tts-1": 2, "codec": 4, "asr": 5, "embedder": 6}
    assert {name: w["env"]["CUDA_VISIBLE_DEVICES"] for name, w in workers.items()} == \
        {name: uuids[i] for name, i in expected.items()}
    for worker in workers.values():
        assert worker["planned_memory_gb"] <= 9.5 <= worker["device_memory_gb"]
    llm = workers["llm"]["argv"]
    assert llm[:3] == ["vllm", "serve", "meta-llama/Llama-3.2-3B-Instruct"]
    assert _flag(llm, "--gpu-memory-utilization") == "0.87"  # 8.62 of 10 GB, rounded up
    assert _flag(llm, "--quantization") == "fp8" and _flag(llm, "--kv-cache-dtype") == "fp8"
    assert _flag(llm, "--max-num-seqs") == "16" and _flag(llm, "--max-model-len") == "4096"
    codec = workers["codec"]
    assert codec["argv"] == [sys.executable, "-m", "workers.serve_worker", "--deployment",
                             str(DEPLOYMENTS / "h100-mig.yaml"), "--worker", "codec", "--port", str(8103)]
    assert codec["ready_path"] == "/readyz" and workers["llm"]["ready_path"] == "/health"
    assert sorted(int(w["url"].rsplit(":", 1)[1]) for w in workers.values()) == list(range(8100, 8106))


def test_h200_deployment_plans_cleanly_with_more_streams(machine, capsys):
    machine.has("h200_7x1g.18gb.txt")
    uuids = slice_uuids("h200_7x1g.18gb.txt")
    workers = planned(capsys, DEPLOYMENTS / "h200-mig.yaml")
    expected = {"llm": 0, "tts-0": 1, "tts-1": 2, "codec": 4, "asr": 5, "embedder": 6}
    assert {name: w["env"]["CUDA_VISIBLE_DEVICES"] for name, w in workers.items()} == \
        {name: uuids[i] for name, i in expected.items()}
    assert all(w["planned_memory_gb"] <= 16.5 for w in workers.values())
    assert workers["tts-0"]["max_streams"] == 8 and workers["llm"]["max_streams"] == 32


@pytest.mark.parametrize("deployment, fixture, wanted, present", [
    ("h100-mig.yaml", "h200_7x1g.18gb.txt", "1g.10gb", "7 x 1g.18gb"),
    ("h200-mig.yaml", "h100_7x1g.10gb.txt", "1g.18gb", "7 x 1g.10gb"),
])
def test_a_gpu_deployment_is_refused_on_the_other_board(machine, capsys, deployment, fixture, wanted, present):
    machine.has(fixture)
    code, out, err = run_plan(capsys, DEPLOYMENTS / deployment)
    assert (code, out) == (2, "")
    for worker in ("llm", "tts-0", "tts-1", "codec", "asr", "embedder"):
        assert f"  - {worker}: device {wanted}#" in err
    assert f"slices of profile {wanted} on this machine: none; it has: {present}" in err


def test_cpu_deployment_plans_without_a_gpu(machine, capsys):
    machine.has(None)
    workers = planned(capsys, DEPLOYMENTS / "cpu.yaml")
    llm = workers["llm"]
    assert llm["env"] == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"}
    argv = llm["argv"]
    assert argv[0] == machine.llama_server and _flag(argv, "-m").endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert [_flag(argv, f) for f in ("--parallel", "-c", "--threads", "--cache-type-k", "--cache-reuse",
                                     "--batch-size")] == ["4", "16384", "2", "f16", "256", "512"]
    assert {"--cont-batching", "--metrics", "--no-webui"} <= set(argv) and "--n-gpu-layers" not in argv
    for name in ("asr", "tts", "embedder"):
        assert (workers[name]["run"], workers[name]["argv"], workers[name]["device"]) == ("in-process", None, "cpu")
    code, out, _ = run_plan(capsys, DEPLOYMENTS / "cpu.yaml")
    assert code == 0 and "inside the agent server" in out and "CUDA_VISIBLE_DEVICES='' OMP_NUM_THREADS=2" in out


# --- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("fixture, workers, messages", [
    ("h100_7x1g.10gb.txt", {"llm": gpu_worker("MIG-00000000-0000-0000-0000-000000000000")},
     ["llm: no MIG slice MIG-00000000-0000-0000-0000-000000000000 on this machine"]),
    ("h100_mixed.txt", {"llm": gpu_worker("1g.10gb#2")},
     ["llm: device 1g.10gb#2: slices of profile 1g.10gb on this machine: 2 (1g.10gb#0..#1)",
      "1 x 3g.40gb, 1 x 2g.20gb, 2 x 1g.10gb"]),
    ("h100_mixed.txt", {"llm": gpu_worker("1g.10gb#0", replicas=3)},
     ["llm-2: device 1g.10gb#2:"]),
    ("h100_7x1g.10gb.txt", {"llm": gpu_worker("1g.10gb#3"), "tts": gpu_worker("1g.10gb#3", role="tts", share_slice=True)},
     ["llm, tts are all on 1g.10gb#3", "set share_slice: true on every one of them"]),
    ("h100_7x1g.10gb.txt", {"llm": gpu_worker("1g.10gb#0", memory={"weights_gb": 8, "kv_cache_gb_per_stream": 0.5,
                                                                   "overhead_gb": 1})},
     ["llm plan 11.00 GB on 1g.10gb#0", "which has 10.0 GB",
      "weights 8 + KV 0.5 x 4 streams + overhead 1 = 11.00", "lower max_streams"]),
    ("h100_mixed.txt", {"llm": gpu_worker("2g.20gb#0", share_slice=True, max_streams=40),
                        "tts": gpu_worker("2g.20gb#0", role="tts", share_slice=True, max_streams=20)},
     ["llm, tts plan 25.00 GB on 2g.20gb#0"]),
    (None, {"llm": gpu_worker("1g.10gb#0")}, ["llm: device 1g.10gb#0 asks for a GPU, but this machine has none"]),
    ("no_devices.txt", {"llm": gpu_worker("cuda:0")}, ["llm: device cuda:0 asks for a GPU, but this machine has none"]),
    ("h100_whole.txt", {"llm": gpu_worker("cuda:1")}, ["llm: device cuda:1: this machine has 1 GPU(s), cuda:0..cuda:0"]),
    ("h100_7x1g.10gb.txt", {"llm": gpu_worker("cuda:0")}, ["llm: device cuda:0: GPU 0 is in MIG mode"]),
    ("h100_7x1g.10gb.txt", {"llm": gpu_worker("1g.10gb#0", memory=None)}, ["llm: on MIG-", "it needs memory:"]),
    ("h100_7x1g.10gb.txt", {"asr": {"engine": "faster-whisper", "run": "in-process", "device": "1g.10gb#0",
                                    "memory": {"weights_gb": 1}}},
     ["asr: an in-process worker cannot have a MIG slice"]),
    ("h100_7x1g.10gb.txt", {"llm": gpu_worker("1g.10gb#0", port=9000), "tts": gpu_worker("1g.10gb#1", role="tts", port=9000)},
     ["tts: port 9000 is also llm's"]),
])
def test_plan_refuses_with_every_problem_named(machine, capsys, tmp_path, fixture, workers, messages):
    machine.has(fixture, exit_code=6 if fixture == "no_devices.txt" else 0)
    code, out, err = run_plan(capsys, write_deployment(tmp_path, workers))
    assert (code, out) == (2, "")
    for message in messages:
        assert message in err


def test_all_problems_are_reported_together(machine, capsys, tmp_path):
    machine.has("h100_mixed.txt")
    workers = {"llm": gpu_worker("1g.10gb#5"), "tts": gpu_worker("MIG-nope", role="tts"),
               "asr": {"engine": "faster-whisper", "device": "1g.10gb#0", "memory": {"weights_gb": 12}}}
    code, _, err = run_plan(capsys, write_deployment(tmp_path, workers))
    assert code == 2 and err.count("\n  - ") == 3
    assert "llm: device 1g.10gb#5" in err and "tts: no MIG slice MIG-nope" in err and "asr plan 12.00 GB" in err


def test_workers_that_all_say_share_slice_may_share_one(machine, capsys, tmp_path):
    machine.has("h100_mixed.txt")
    workers = {"llm": gpu_worker("3g.40gb#0", share_slice=True), "tts": gpu_worker("3g.40gb#0", role="tts", share_slice=True)}
    planned_workers = planned(capsys, write_deployment(tmp_path, workers))
    first = slice_uuids("h100_mixed.txt")[0]
    assert [w["env"]["CUDA_VISIBLE_DEVICES"] for w in planned_workers.values()] == [first, first]
    # Each engine is told its own share of the slice: (4 + 0.25 x 4 + 1) / 40 GB.
    assert {_flag(w["argv"], "--gpu-memory-utilization") for w in planned_workers.values()} == {"0.15"}


def test_an_unknown_key_is_refused_with_its_path(machine, capsys, tmp_path):
    machine.has(None)
    workers = {"llm": {"engine": "llama-server", "model": "package:smollm2-135m-instruct",
                       "batching": {"max_bach": 8}}}
    code, _, err = run_plan(capsys, write_deployment(tmp_path, workers))
    assert code == 2 and "workers.llm.batching.max_bach: unknown key; known: max_batch, timeout_ms" in err


@pytest.mark.parametrize("settings, message", [
    ({"max_streams": 0}, "workers.w: max_streams must be >= 1"),
    ({"replicas": 0}, "workers.w: replicas must be >= 1"),
    ({"batching": {"timeout_ms": 0}}, "workers.w.batching: timeout_ms must be in (0, 1000]"),
    ({"batching": {"timeout_ms": 1001}}, "workers.w.batching: timeout_ms must be in (0, 1000]"),
    ({"engine": "tgi"}, "workers.w: engine must be one of llama-server, vllm"),
    ({"engine": "snac"}, "workers.w: engine snac serves codec, not role llm"),
    ({"role": "vad"}, "workers.w: role must be one of asr, llm"),
    ({"run": "external"}, "url is required for run: external, and only there"),
    ({"url": "http://llm:8000"}, "url is required for run: external, and only there"),
    ({"device": "gpu0"}, "workers.w: device 'gpu0': use cpu, cuda:N, MIG-<uuid> or <profile>#<index>"),
    ({"device": ["cuda:0", "cuda:1"]}, "device: give one device, or one per replica (1)"),
    ({"precision": {"weights": "fp4"}}, "workers.w.precision: weights must be one of fp32"),
    ({"max_streams": "4"}, "workers.w.max_streams: expected int, got '4'"),
    ({"port": 8200, "replicas": 2}, "a fixed port cannot serve several replicas"),
    ({"name": "x"}, "workers.w.name: unknown key"),
])
def test_deployment_values_are_validated_at_load(settings, message):
    worker = {"engine": "vllm", "role": "llm", "model": "org/model", **settings}
    with pytest.raises(ConfigError) as refused:
        parse_deployment({"name": "t", "workers": {"w": worker}}, "t.yaml")
    assert message in str(refused.value)


def test_a_top_level_typo_is_refused(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("name: d\nworker: {}\n")
    with pytest.raises(ConfigError, match="^worker: unknown key; known: host, name, workers$"):
        load_deployment(path)


# --- launches -----------------------------------------------------------------------------


def _plan(workers: dict, fixture: str | None = None, **options):
    gpus = parse_nvidia_smi_list(listing(fixture)) if fixture else ()
    return plan(parse_deployment({"name": "t", "workers": workers}, "/srv/t.yaml"), gpus, **options)


def _flag(argv: list[str] | tuple[str, ...], flag: str) -> str:
    return argv[list(argv).index(flag) + 1]


def test_a_whole_gpu_is_named_in_pci_order():
    (llm,) = _plan({"llm": gpu_worker("cuda:0")}, "h100_whole.txt").launches
    assert llm.env == {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert (llm.device, llm.planned_memory_gb, _flag(llm.argv, "--gpu-memory-utilization")) == ("cuda:0", 6.0, "0.08")


def test_trtllm_serve_gets_its_batch_and_kv_cache_share():
    worker = gpu_worker("1g.10gb#0", engine="trtllm-serve", context_tokens_per_stream=2048)
    (launch,) = _plan({"llm": worker}, "h100_7x1g.10gb.txt").launches
    assert launch.argv[:2] == ("trtllm-serve", "org/model")
    # KV 0.25 x 4 = 1 GB out of the 10 - 4 - 1 = 5 GB left after weights and overhead.
    assert [_flag(launch.argv, f) for f in ("--max_batch_size", "--max_seq_len", "--kv_cache_free_gpu_memory_fraction")] \
        == ["4", "2048", "0.20"]
    assert launch.ready_path == "/health"


def test_replicas_take_the_listed_devices_and_ports_skip_fixed_ones():
    uuids = slice_uuids("h100_mixed.txt")
    workers = {"asr": {"engine": "faster-whisper", "device": [uuids[3], "1g.10gb#0"], "replicas": 2,
                       "memory": {"weights_gb": 3.1}},
               "llm": gpu_worker("3g.40gb#0", port=8101)}
    result = _plan(workers, "h100_mixed.txt", base_port=8100)
    assert [(w.name, w.device, w.port) for w in result.launches] == \
        [("asr-0", uuids[3], 8100), ("asr-1", uuids[2], 8102), ("llm", uuids[0], 8101)]
    assert _flag(result.launches[1].argv, "--worker") == "asr"


def test_in_process_and_external_workers_start_no_process():
    result = _plan({"asr": {"engine": "faster-whisper", "run": "in-process"},
                    "llm": {"engine": "vllm", "run": "external", "url": "http://gpu-box:8000"}})
    assert result.launches == ()
    assert [(w.name, w.url, w.placement and w.placement.device) for w in result.workers] == \
        [("asr", None, "cpu"), ("llm", "http://gpu-box:8000", None)]


def test_llama_server_problems_say_what_to_do():
    workers = {"llm": {"engine": "llama-server", "model": "package:smollm2-135m-instruct"},
               "tts": {"engine": "llama-server", "model": "/m/orpheus.gguf", "precision": {"kv_cache": "fp8"}}}
    with pytest.raises(ConfigError) as refused:
        _plan(workers, find_binary=lambda name: None)
    assert "llm: llama-server is not built; run `make llama-server`" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        _plan(workers, find_binary=lambda name: "/opt/llama-server")
    assert "llm: model 'package:smollm2-135m-instruct' is not a local GGUF file" in str(refused.value)
    assert "tts: llama-server has no fp8 KV cache; use f16, bf16 or q8_0" in str(refused.value)


def test_vllm_needs_a_gpu():
    with pytest.raises(ConfigError, match="llm: vllm runs on a GPU"):
        _plan({"llm": {"engine": "vllm", "model": "org/model"}})
