"""A lost transcript (pipelines/transcript_loss.py): pure, no engine, no loop."""

import pytest

from models.errors import CapacityError, StalledError, WorkerUnavailableError
from pipelines.options import TranscriptDeadline
from pipelines.transcript_loss import deadline_s, lost_transcript


def test_the_deadline_grows_with_the_turn_and_none_means_no_limit():
    deadline = TranscriptDeadline(seconds=2.0, per_audio_second=0.5)
    assert deadline_s(deadline, 0.0) == 2.0 and deadline_s(deadline, 10.0) == 7.0
    assert deadline_s(None, 10.0) is None


def test_a_deadline_passed_is_a_stall_named_with_its_limit():
    lost = lost_transcript(TimeoutError(), deadline_s=4.7, part=False)
    assert lost.kind == "stalled" and lost.known and isinstance(lost.error, StalledError)
    assert str(lost.error) == "no transcript within 4.7 s"


@pytest.mark.parametrize("exc, kind", [
    (StalledError("the worker stopped answering"), "stalled"),
    (WorkerUnavailableError("ASR worker went away mid-request"), "error"),
    (CapacityError("asr worker is busy"), "error"),
])
def test_our_failures_are_known_and_reported_as_they_are(exc, kind):
    lost = lost_transcript(exc, deadline_s=None, part=False)
    assert lost.kind == kind and lost.known and lost.error is exc


def test_a_bug_is_an_error_not_known_so_its_traceback_is_logged():
    exc = KeyError("oops")
    lost = lost_transcript(exc, deadline_s=3.0, part=False)
    assert lost.kind == "error" and not lost.known and lost.error is exc


def test_the_turns_end_is_apologised_for_and_a_long_turns_part_is_not_yet():
    end = lost_transcript(StalledError("stuck"), deadline_s=3.0, part=False)
    part = lost_transcript(StalledError("stuck"), deadline_s=3.0, part=True)
    assert end.apologise and end.consequence == "the caller hears an apology"
    assert not part.apologise and part.consequence == "the caller is told at the turn's end if need be"
