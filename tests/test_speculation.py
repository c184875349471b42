"""The guess made at a pause, as bookkeeping (pipelines/speculation.py): pure, no audio, no loop."""

from models.base import Transcript
from pipelines.speculation import GuessReading, PauseStep, Speculation, read_guess


def test_a_pause_starts_one_guess_while_the_caller_is_on_a_turn_with_audio():
    guesses: Speculation[str] = Speculation()
    assert guesses.at_pause(speaking=False, buffered=3200) is PauseStep.UNDECIDED  # no turn under way
    assert guesses.at_pause(speaking=True, buffered=0) is PauseStep.UNDECIDED  # nothing heard yet
    assert guesses.at_pause(speaking=True, buffered=3200) is PauseStep.GUESS
    guesses.started(3200, "run-1")
    assert guesses.pending
    # A second pause signal while the guess is out waits for its verdict, whatever the VAD says.
    assert guesses.at_pause(speaking=True, buffered=6400) is PauseStep.WAIT
    assert guesses.at_pause(speaking=False, buffered=0) is PauseStep.WAIT


def test_a_guess_dropped_is_handed_back_to_be_cancelled_and_counted_once():
    guesses: Speculation[str] = Speculation()
    assert guesses.drop() is None and guesses.dropped == 0  # nothing out: nothing counted
    guesses.started(3200, "run-1")
    assert guesses.drop() == "run-1" and guesses.dropped == 1 and not guesses.pending
    assert guesses.drop() is None and guesses.dropped == 1
    assert guesses.at_pause(speaking=True, buffered=6400) is PauseStep.GUESS  # the next pause guesses afresh


def test_the_turns_end_takes_the_guess_only_if_the_turn_holds_all_it_saw():
    guesses: Speculation[str] = Speculation()
    assert guesses.take(3200) is None
    guesses.started(3200, "run-1")
    assert guesses.take(3200 + 640) == "run-1"  # what it saw, plus the silence that ended the turn
    assert not guesses.pending and guesses.dropped == 0
    guesses.started(3200, "run-2")
    assert guesses.take(3199) is None  # not of this audio
    assert not guesses.pending and guesses.dropped == 0  # taken all the same, not counted as dropped
    assert guesses.used == 0
    guesses.stood_for_turn()
    assert guesses.used == 1


def test_a_plausible_guess_is_the_words_so_far_and_shown_only_with_partials_on():
    said = Transcript("book a table", 1.0, 0.1, no_speech_probability=0.1)
    assert read_guess(said, partials_on=True) == GuessReading(words="book a table", shown="book a table")
    assert read_guess(said, partials_on=False) == GuessReading(words="book a table", shown=None)
    for implausible in (Transcript("", 1.0, 0.1), Transcript("Hello. Hello. Hello. Hello. Hello.", 2.0, 0.1)):
        for partials_on in (True, False):
            assert read_guess(implausible, partials_on=partials_on) == GuessReading(words=None, shown=None)
