"""A call's LLM context forgets the dialogue no prompt can reach again (pipelines/dialogue_context.py)."""

from __future__ import annotations

from pipecat.processors.aggregators.llm_context import LLMContext

from pipelines.dialogue_context import DialogueContext
from pipelines.llm import prompt_window

SYSTEM = {"role": "system", "content": "You answer for Oakwood Family Clinic."}


def message(n: int) -> dict:
    return {"role": "user" if n % 2 == 0 else "assistant", "content": f"message {n} " + "word " * (n % 7)}


def test_a_long_call_keeps_a_bounded_context_and_every_prompt_is_what_the_whole_history_gives():
    """Before: the context kept every message of the call (two a turn) for as long as it lasted."""
    max_history = 12
    bounded = DialogueContext(messages=[SYSTEM], max_history_messages=max_history)
    whole = [SYSTEM]
    longest = 0
    for n in range(2000):  # 1,000 turns
        bounded.add_message(message(n))
        whole.append(message(n))
        longest = max(longest, len(bounded.messages))
        for chars in (None, 4000, 300):  # the KV-cache-friendly start and the character budget alike
            assert prompt_window(bounded.get_messages(), max_history, chars) == \
                prompt_window(whole, max_history, chars), n
    assert longest == 1 + max_history  # the system prompt and the window: nothing else
    assert bounded.messages[0] == SYSTEM and bounded.messages[-1] == whole[-1]


def test_messages_added_together_are_bounded_too_and_the_system_prompt_stays():
    bounded = DialogueContext(messages=[SYSTEM], max_history_messages=4)
    bounded.add_messages([message(n) for n in range(50)])
    assert prompt_window(bounded.get_messages(), 4) == prompt_window([SYSTEM] + [message(n) for n in range(50)], 4)
    assert len(bounded.messages) <= 1 + 4 and bounded.messages[0] == SYSTEM


def test_the_cascade_gives_each_call_a_bounded_context(default_config):
    from agent.agents import AgentLimits, parse_spec, resolve
    from pipelines.cascade import cascade_stages
    from pipelines.call_events import CallEvents
    from pipelines.voice import Engines
    from tests.fakes import ScriptedASR, ScriptedLLM, ToneTTS

    agent = resolve(parse_spec({"name": "front-desk", "system_prompt": "You book appointments."},
                               AgentLimits(max_prompt_chars=200, max_greeting_chars=50)),
                    default_config)
    stages = cascade_stages(engines=Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello."]), tts=ToneTTS()),
                            options=default_config.call_options(), agent=agent, search=None, events=CallEvents())
    context: LLMContext = stages.context
    for n in range(500):  # as the aggregators write each turn: the caller's words, then the reply
        context.add_message(message(n))
    assert len(context.messages) <= 1 + default_config.llm.max_history_messages
