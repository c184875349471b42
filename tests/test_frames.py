"""Cadence's frame vocabulary is in one place: every frame class of ours is defined in
pipelines/frames.py, and says who makes it and who reads it."""

import ast
import inspect
from pathlib import Path

from pipecat.frames.frames import Frame

import pipelines.frames

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("models", "pipelines", "workers", "knowledge", "transcription", "agent")


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def test_every_frame_class_of_the_product_is_defined_in_pipelines_frames():
    elsewhere = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "pipelines" / "frames.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(_base_name(b).endswith("Frame") for b in node.bases):
                    elsewhere.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert elsewhere == []


def test_each_frame_says_who_makes_it_and_who_reads_it():
    ours = [cls for _, cls in inspect.getmembers(pipelines.frames, inspect.isclass)
            if issubclass(cls, Frame) and cls.__module__ == pipelines.frames.__name__]
    assert len(ours) >= 6
    unsaid = [cls.__name__ for cls in ours
              if "Made by" not in (cls.__doc__ or "") or "Read" not in (cls.__doc__ or "").split("Made by", 1)[-1]]
    assert unsaid == []
