"""One exception tree under CadenceError: knowledge's and transcription's included, each
exception drawn in agent/errors.py's docstring, and one mapping of the tree to HTTP statuses."""

import ast
import inspect
import json
from pathlib import Path

import pytest

from agent import errors as agent_errors
from agent.http_util import error_for
from knowledge import errors as knowledge_errors
from models import errors as model_errors
from models.errors import CadenceError
from transcription import errors as transcription_errors

MODULES = (model_errors, agent_errors, knowledge_errors, transcription_errors)
ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("agent", "pipelines", "models", "workers", "knowledge", "transcription")


def exceptions_of(module) -> list[type]:
    return [cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, BaseException) and cls.__module__ == module.__name__]


def test_every_exception_of_ours_is_a_cadence_error_and_drawn_in_the_tree():
    found = [cls for module in MODULES for cls in exceptions_of(module)]
    assert len(found) > 35
    assert [cls.__name__ for cls in found if not issubclass(cls, CadenceError)] == []
    drawing = agent_errors.__doc__
    assert [cls.__name__ for cls in found if f" {cls.__name__} " not in drawing] == []


def cadence_errors_defined_in(paths) -> set[str]:
    """Names of the classes that derive from CadenceError, read from the source (nothing imported)."""
    bases: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
    tree = {"CadenceError"}
    while grown := {name for name, of in bases.items() if of & tree} - tree:
        tree |= grown
    return tree


def test_every_cadence_error_anywhere_in_the_product_is_drawn():
    defined = cadence_errors_defined_in(sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py")))
    assert {"RealtimeProtocolError", "TokenSourceError", "KnowledgeBusy", "JobQueueFull"} <= defined
    assert sorted(name for name in defined if f" {name} " not in agent_errors.__doc__) == []


def test_the_branches_keep_their_names_statuses_and_retry_advice():
    assert issubclass(knowledge_errors.DocumentTooLarge, knowledge_errors.KnowledgeError)
    assert issubclass(transcription_errors.JobQueueFull, transcription_errors.TranscriptionError)
    assert (knowledge_errors.DocumentTooLarge.http_status, knowledge_errors.KnowledgeBusy.retryable) == (413, True)
    assert (transcription_errors.JobNotFound.http_status, transcription_errors.JobNotFound.retryable) == (404, False)
    with pytest.raises(CadenceError):  # an `except CadenceError` now catches them too
        raise knowledge_errors.EmbedderUnavailable("the embedder cannot run")


@pytest.mark.parametrize("exc, status, retryable", [
    (knowledge_errors.UnsupportedDocumentType("a.exe: not a document"), 415, False),
    (knowledge_errors.IngestQueueFull("busy"), 503, True),
    (transcription_errors.AudioTooLong("call.mp3: too long"), 413, False),
    (agent_errors.NotFoundError("no agent x"), 404, False),
    (agent_errors.ConfigError("agent.name: required"), 422, False),
    (agent_errors.CapacityError("full"), 503, True),
])
def test_one_mapping_from_the_tree_to_http_statuses(exc, status, retryable):
    response = error_for(exc)
    assert response.status_code == status
    assert json.loads(response.body) == {"error": str(exc), "retryable": retryable}
