"""The STT's bookkeeping of a turn, fed step by step: no audio, no engine, no event loop."""

from pipelines.transcript_plan import AudioStep, QueuedSegment, TranscriptPlan

WINDOW = 1000  # bytes of one engine window
EVERY = 200  # bytes of new speech between partial passes


def plan(every: int = EVERY) -> TranscriptPlan:
    p = TranscriptPlan(max_segment_bytes=WINDOW, partial_every_bytes=every)
    p.turn_starting()
    p.partials_from(100)  # the pre-roll from before the VAD spoke
    return p


def steps(p: TranscriptPlan, lengths, *, partial_running: bool = False, speaking: bool = True):
    return [p.audio(n, speaking=speaking, partial_running=partial_running) for n in lengths]


def test_a_partial_is_due_every_so_much_new_speech_counted_from_after_the_pre_roll():
    p = plan()
    assert steps(p, [150, 299, 300, 450, 500]) == [None, None, AudioStep.PARTIAL, None, AudioStep.PARTIAL]


def test_one_partial_at_a_time_none_in_a_pause_none_while_quiet_and_none_when_turned_off():
    p = plan()
    assert steps(p, [400], partial_running=True) == [None]  # waits for the running pass
    assert steps(p, [400]) == [AudioStep.PARTIAL]
    p.paused = True
    assert steps(p, [800, WINDOW + 50]) == [None, None]  # the turn may be ending: no pass, no cut
    p.paused = False
    assert steps(p, [800], speaking=False) == [None]
    assert steps(plan(every=0), [300, 900]) == [None, None]


def test_a_turn_reaching_one_window_is_cut_and_partials_start_afresh_on_the_rest():
    p = plan()
    assert steps(p, [WINDOW]) == [AudioStep.CUT]
    p.heard("hello there")
    p.heard("hello there my")
    assert p.settled == "hello there"
    p.cut(remaining=150)
    assert p.cuts == 1 and p.settled == ""  # settled words are not forced on the part
    assert p.next_is_part and p.next_segment() == QueuedSegment("", whole_turn_end=False)
    assert steps(p, [349, 350]) == [None, AudioStep.PARTIAL]  # from the 150 left over


def test_the_turns_end_queues_its_settled_words_and_the_next_turn_starts_clean():
    p = plan()
    assert p.heard("I need") == "I need"
    assert p.heard("I need to change") == "I need to change"  # the settled words, then the tentative rest
    assert p.settled == "I need"
    p.turn_ended()
    assert not p.next_is_part and p.next_segment() == QueuedSegment("I need", whole_turn_end=True)
    assert p.settled == ""
    # A segment nobody queued (pipecat's own) is a turn's end with nothing settled.
    assert p.next_segment() == QueuedSegment("", whole_turn_end=True)
    p.paused = True
    p.turn_starting()
    assert not p.paused and p.settled == ""


def test_a_turn_that_grew_past_a_window_in_a_pause_is_cut_before_it_ends():
    p = plan()
    assert not p.needs_cut_at_end(WINDOW) and p.needs_cut_at_end(WINDOW + 1)
    p.cut(remaining=10)
    p.turn_ended()
    assert [p.next_is_part, p.next_segment().whole_turn_end, p.next_is_part, p.next_segment().whole_turn_end] == \
        [True, False, False, True]
