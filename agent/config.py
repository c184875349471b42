"""Server configuration: frozen dataclasses filled from YAML, validated at load.

Nothing deep in the code reads configuration from globals: the app factory gets one
`CadenceConfig` and hands each part to the component that needs it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agent.auth import AuthConfig
from agent.errors import ConfigError
from knowledge.options import KnowledgeOptions
from models.config_loader import build_dataclass, read_yaml
from models.orpheus.options import OrpheusOptions
from models.piper_tts import PiperOptions
from models.stalls import StallLimits
from models.whisper_asr import WhisperOptions
from pipelines.options import CallOptions, PauseOptions, TranscriptDeadline, VADOptions
from pipelines.turn_end import TurnEndOptions
from transcription.jobs import JobLimits
from transcription.options import TranscriptionOptions
from workers.own_llama_server import LlamaServerOptions

SCHEDULES = ("wanted-by", "arrival")  # server.schedule
OrpheusConfig = OrpheusOptions  # the name the config has always used for tts.orpheus


@dataclass(frozen=True)
class IceServer:
    urls: tuple[str, ...]  # e.g. ("stun:stun.example.org:3478",) or ("turn:turn.example.org:3478?transport=udp",)
    username: str | None = None  # TURN credentials; never logged
    credential: str | None = None


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # Admission control: calls beyond this are refused (HTTP 503 / WebSocket close 1013) rather
    # than degrading every call already in progress. 1: what 2 CPU cores hold within TTFS p95
    # 1.5 s (`latency_bench capacity`); measure your machine and raise it.
    max_concurrent_calls: int = 1
    # How a shared engine orders the requests waiting for it: "wanted-by" (a reply's first
    # sentence and a turn's final transcript before audio that is not needed yet;
    # models/scheduling.py) or "arrival" (first come, first served: for A/B measurements).
    schedule: str = "wanted-by"
    # Largest WebSocket message accepted. A Twilio `media` event for 20 ms is ~300 bytes.
    max_ws_message_bytes: int = 16_384
    # Largest SDP offer accepted on /api/offer. Real offers are 2-6 KB.
    max_sdp_bytes: int = 65_536
    # STUN/TURN servers handed to WebRTC peers. Empty means host candidates only, so nothing
    # talks to a public STUN server unless an operator asks for it.
    ice_servers: tuple[IceServer, ...] = ()
    # A connection must have sent its whole request head (the HTTP request line and headers,
    # or a WebSocket upgrade) this long after it opened or after its last request; one that
    # trickles or sends nothing is closed. Real clients send theirs in one packet.
    request_header_timeout_seconds: float = 5.0
    # On SIGTERM: /readyz turns 503, new calls are refused, and live calls get this long to
    # finish before they are ended (stored as server_shutdown). Keep it under the pod's
    # termination grace period (Kubernetes: 30 s by default). A second signal stops at once.
    shutdown_grace_seconds: float = 25.0


@dataclass(frozen=True)
class CallLimits:
    max_call_seconds: float = 1800.0  # a call is hung up after this long, whatever happens in it
    # Seconds with neither the caller nor the agent speaking before the call is hung up.
    idle_timeout_seconds: float = 120.0
    # Malformed or unknown inbound messages tolerated per call before it is closed (1008).
    max_bad_messages: int = 50
    max_user_turn_seconds: float = 30.0  # Whisper's window; longer turns are cut and transcribed
    # How far a caller's audio may run ahead of the clock (a jitter buffer, a pre-roll); more is
    # refused and counted as a bad message: an hour of audio sent in seconds would all be queued.
    max_audio_ahead_seconds: float = 10.0
    # A caller must finish its transport's handshake this long after it connects: a phone
    # socket sends Twilio's `start` (or is closed 1008), a WebRTC peer completes ICE and DTLS
    # after its answer (or is hung up). A real provider or browser needs a second or two; the
    # slot waits for no one longer.
    handshake_timeout_seconds: float = 5.0


@dataclass(frozen=True)
class VADConfig:
    confidence: float = 0.7  # Silero speech probability threshold
    start_secs: float = 0.2  # voiced time before "user started speaking"
    # Silence before "user stopped speaking". Every millisecond here is paid in TTFS.
    stop_secs: float = 0.4
    min_volume: float = 0.6  # pipecat's volume gate, suppresses low-level line noise


# Each engine section is the engine's own options (defined beside it in models/) plus what
# the server decides around it: which engine, and how the pipeline uses it.


@dataclass(frozen=True)
class ASRConfig(WhisperOptions):
    engine: str = "faster-whisper"
    # Start transcribing once the caller has been silent this long, while the VAD still waits
    # out vad.stop_secs; dropped if they go on. Below ~0.1 s every gap between words triggers a
    # wasted run; 0 turns speculation off.
    speculate_after_secs: float = 0.15
    # Streaming partials: while the caller speaks, the turn so far is transcribed again after
    # each this much more speech; settled words (two passes agree) are forced on the final
    # pass, which then decodes only the rest. 0 turns it off (the default until measured to
    # pay for its CPU on a loaded machine; see pipelines/stt.py).
    partial_every_s: float = 0.0
    # ASR served by a worker (a deployment's asr): a transcript the worker fails (it died, is
    # restarting, or refused it as full) is made by the Whisper above, loaded in this process as well (~150 MB for
    # whisper-base), instead of the turn being lost. false: the turn waits for the worker within
    # its deadline (deadlines.asr_*), then the caller hears an apology.
    worker_fallback: bool = True


@dataclass(frozen=True)
class TurnEndConfig(TurnEndOptions):
    # Judge every pause by the caller's words and voice (pipelines/turn_end.py): a finished
    # turn ends after complete_pause_s, an unfinished one waits up to incomplete_pause_s, the
    # rest after the agent's vad stop. Needs asr.speculate_after_secs > 0 (the words).
    # Off: every pause is the agent's vad stop.
    enabled: bool = True
    # The voice's judge: Smart Turn v3 as ONNX (package:<name> or a .onnx path); "" for none,
    # and then the words alone can only lengthen a pause, never shorten it.
    voice_model: str = "package:smart-turn-v3.2"
    # Start the reply at the pause, on the speculative transcript; it is held until the
    # turn ends, and dropped if the caller goes on or the final words differ.
    eager_reply: bool = True


@dataclass(frozen=True)
class LLMConfig(LlamaServerOptions):
    # llama-server: llama.cpp's server, started by this process where no deployment places the
    # LLM in a worker of its own (workers/own_llama_server.py). `llama-cpp`, its former name, is
    # the same engine.
    engine: str = "llama-server"
    max_reply_tokens: int = 64  # ~10 s of speech; a phone reply longer than that loses the caller
    # Generation stops after this many sentences (0 = no cap): two sentences are a phone reply;
    # a small model that rambles past them is cut rather than heard.
    max_reply_sentences: int = 2
    # Turns of history kept in the prompt; older turns are dropped to bound prompt cost.
    max_history_messages: int = 12
    # Characters of dialogue (history and the caller's turn) in a prompt, ~1,100 tokens, at most:
    # an agent whose system prompt leaves less of the LLM's context gets less (pipelines/
    # prompt_budget.py). Older messages go first; a caller's turn longer than this alone keeps
    # its end (ten minutes of talk is ~9,000).
    max_dialogue_chars: int = 4000


@dataclass(frozen=True)
class TTSConfig(PiperOptions):
    engine: str = "piper"  # or "orpheus"
    orpheus: OrpheusOptions = OrpheusOptions()
    # A voice served by a worker (a deployment's tts): a sentence it fails, or gives no audio
    # for within fallback_after_seconds (a worker that died or is stuck), is said by the CPU
    # voice above, loaded in this process as well. false: such a sentence is skipped.
    worker_fallback: bool = True
    fallback_after_seconds: float = 1.5


@dataclass(frozen=True)
class ModelDeadlines:
    """How long a turn waits on each model before the caller hears why instead of silence.
    A worker that is stopped or stuck sends nothing, and its client would wait out its read
    timeout (30 s); past these the turn gives up on it (models/stalls.py): a lost transcript
    or reply is answered with a short spoken apology, a lost sentence is skipped. Set them
    above what the slowest healthy turn takes on your hardware at full load: a deadline
    that fires on a slow but healthy model turns a late reply into an apology."""

    # A turn's final transcript: this, plus asr_per_audio_second for each second of the turn.
    asr_seconds: float = 3.0
    asr_per_audio_second: float = 0.5
    # A reply's first token (queueing and prompt evaluation included), then between tokens.
    # A long agent prompt is evaluated before the first token, and a model evaluating a prompt
    # is not stuck: where the server reports its progress through the prompt (llama-server),
    # each report restarts the first token's deadline; where it does not, the deadline grows by
    # llm_first_token_per_1k_prompt_chars for every 1,000 characters of the prompt (system
    # prompt, passages, dialogue).
    llm_first_token_seconds: float = 6.0
    llm_first_token_per_1k_prompt_chars: float = 1.5
    llm_token_gap_seconds: float = 3.0
    # A sentence's first audio (a fallback voice's included), then between its chunks.
    tts_first_audio_seconds: float = 5.0
    tts_audio_gap_seconds: float = 3.0

    @property
    def llm(self) -> StallLimits:
        return StallLimits(self.llm_first_token_seconds, self.llm_token_gap_seconds,
                           first_per_kchar_s=self.llm_first_token_per_1k_prompt_chars)

    @property
    def tts(self) -> StallLimits:
        return StallLimits(self.tts_first_audio_seconds, self.tts_audio_gap_seconds)

    def asr_seconds_for(self, audio_seconds: float) -> float:
        return self.asr_seconds + self.asr_per_audio_second * audio_seconds


# The allowances a deadline grows by with the request's size: 0 turns that growth off.
_PER_UNIT_DEADLINES = ("asr_per_audio_second", "llm_first_token_per_1k_prompt_chars")


@dataclass(frozen=True)
class AgentsConfig:
    """Where agents come from and the limits on what a developer may define."""

    dir: str = "configs/agents"  # every *.yaml here is an agent, loaded at start; a bad file stops startup
    default: str = "default"  # the agent a call gets when it names none
    max_prompt_chars: int = 8000  # ~2k tokens: a longer prompt crowds out history and passages
    max_greeting_chars: int = 500  # ~30 s of speech
    max_agents: int = 1000  # agents defined through the API; creating more is refused (409)
    max_body_bytes: int = 65_536  # largest agent definition or chat request accepted over HTTP


@dataclass(frozen=True)
class RetrievalDefaults:
    """Retrieval in every call, for agents that do not choose otherwise (agent.knowledge)."""

    enabled: bool = True
    # Passages per turn. 2 answered as many of latency_bench quality's questions as 3 on the
    # default agent (25.8 % both) with two thirds of the prefill, which a CPU pays in TTFS.
    top_k: int = 2
    # Prompt tokens for passages; each costs prefill before the first token (~4.5 ms a token
    # for SmolLM2-135M on 2 cores; ~0.05 ms on a GPU).
    max_tokens: int = 200
    # A turn waits at most this long for its passages before the LLM starts without them.
    timeout_ms: float = 250.0
    # Have the LLM read the prompt up to the passages as soon as a speculative transcript's
    # search returns. Off by default: one llama.cpp context cannot stop a prefill it started,
    # so a guess the caller talks past (a pause mid-question) holds the turn's own request
    # behind ~1 s of wasted prefill on 2 cores. latency_bench retrieval-ab: retrieval added
    # 3.2 s TTFS p50 with it on (and 3 passages), 0.96 s with it off (and 2). For engines that
    # serve requests side by side with a prefix cache (vLLM) it is a head start.
    warm_llm_on_guess: bool = False


@dataclass(frozen=True)
class TranscriptionConfig(TranscriptionOptions):
    """Long recordings (`cadence transcribe`, POST /api/transcriptions): how they are cut and
    transcribed (transcription/options.py), and the API's limits (transcription/jobs.py)."""

    max_upload_bytes: int = JobLimits.max_upload_bytes  # a larger upload is refused (413)
    max_pending_jobs: int = JobLimits.max_pending_jobs  # jobs waiting; one more is refused (503)
    job_history: int = JobLimits.job_history  # finished jobs kept for lookups
    max_speakers: int = JobLimits.max_speakers
    upload_dir: str = "data/transcriptions"  # uploads wait here until their job ends

    def job_limits(self) -> JobLimits:
        return JobLimits(max_upload_bytes=self.max_upload_bytes, max_pending_jobs=self.max_pending_jobs,
                         job_history=self.job_history, max_speakers=self.max_speakers)

    def options(self) -> TranscriptionOptions:
        return TranscriptionOptions(**{f.name: getattr(self, f.name) for f in fields(TranscriptionOptions)})


@dataclass(frozen=True)
class StoreConfig:
    path: str = "data/cadence.sqlite3"  # SQLite file for calls and turns; ":memory:" in tests


@dataclass(frozen=True)
class CadenceConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: CallLimits = field(default_factory=CallLimits)
    vad: VADConfig = field(default_factory=VADConfig)
    asr: ASRConfig = field(default_factory=ASRConfig)
    turn_end: TurnEndConfig = field(default_factory=TurnEndConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    deadlines: ModelDeadlines = field(default_factory=ModelDeadlines)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    retrieval: RetrievalDefaults = field(default_factory=RetrievalDefaults)
    # Agents' documents: upload limits, chunking, the embedder and the hybrid search.
    knowledge: KnowledgeOptions = field(default_factory=KnowledgeOptions)
    store: StoreConfig = field(default_factory=StoreConfig)
    # Who may start calls and change agents: API keys, client tokens, origins, session caps.
    auth: AuthConfig = field(default_factory=AuthConfig)
    transcription: TranscriptionConfig = field(default_factory=TranscriptionConfig)
    # A deployment file (configs/deployments/*.yaml): which models run in worker processes
    # that `cadence serve` starts (or that run elsewhere), and on which device. None: every
    # model runs inside this server, from the sections above.
    deployment: str | None = None

    def __post_init__(self) -> None:
        _validate(self)

    def call_options(self) -> CallOptions:
        """What every call's pipeline reads of this configuration (pipelines/options.py)."""
        return CallOptions(
            vad=VADOptions(confidence=self.vad.confidence, start_secs=self.vad.start_secs,
                           min_volume=self.vad.min_volume),
            pauses=PauseOptions(judged=self.turn_end.enabled, eager_reply=self.turn_end.eager_reply,
                                limits=self.turn_end),
            schedule_by_wanted=self.server.schedule == "wanted-by",
            max_user_turn_seconds=self.limits.max_user_turn_seconds,
            partial_every_s=self.asr.partial_every_s,
            transcript_deadline=TranscriptDeadline(self.deadlines.asr_seconds, self.deadlines.asr_per_audio_second),
            max_history_messages=self.llm.max_history_messages,
            llm_stall_limits=self.deadlines.llm,
            tts_stall_limits=self.deadlines.tts,
            retrieval_timeout_s=self.retrieval.timeout_ms / 1000.0,
            warm_llm_on_guess=self.retrieval.warm_llm_on_guess,
            orpheus_model=self.tts.orpheus.model if self.tts.engine == "orpheus" else None,
        )


def _validate(config: CadenceConfig) -> None:
    checks = [
        (1 <= config.server.port <= 65535, "server.port must be 1..65535"),
        (config.server.max_concurrent_calls >= 1, "server.max_concurrent_calls must be >= 1"),
        (config.asr.partial_every_s == 0 or config.asr.partial_every_s >= 0.2,
         "asr.partial_every_s must be 0 (off) or at least 0.2 s"),
        (config.asr.onednn_primitive_cache >= 0, "asr.onednn_primitive_cache must be >= 0"),
        (config.server.schedule in SCHEDULES, f"server.schedule must be one of {', '.join(SCHEDULES)}"),
        (min(config.transcription.max_upload_bytes, config.transcription.max_pending_jobs,
             config.transcription.job_history, config.transcription.max_speakers) >= 1,
         "transcription: max_upload_bytes, max_pending_jobs, job_history and max_speakers must be >= 1"),
        (config.server.max_ws_message_bytes >= 1024, "server.max_ws_message_bytes must be >= 1024"),
        (config.limits.max_call_seconds > 0, "limits.max_call_seconds must be > 0"),
        (0 < config.limits.max_user_turn_seconds <= 30, "limits.max_user_turn_seconds must be in (0, 30]"),
        (config.limits.max_audio_ahead_seconds >= 1, "limits.max_audio_ahead_seconds must be >= 1"),
        (0 < config.limits.handshake_timeout_seconds <= 60, "limits.handshake_timeout_seconds must be in (0, 60]"),
        (0 < config.server.request_header_timeout_seconds <= 60,
         "server.request_header_timeout_seconds must be in (0, 60]"),
        (0 <= config.server.shutdown_grace_seconds <= 3600, "server.shutdown_grace_seconds must be in [0, 3600]"),
        (0.0 < config.vad.confidence < 1.0, "vad.confidence must be in (0, 1)"),
        (0.05 <= config.vad.stop_secs <= 3.0, "vad.stop_secs must be in [0.05, 3]"),
        (config.tts.engine in ("piper", "orpheus"), "tts.engine must be piper or orpheus"),
        (1 <= config.tts.orpheus.max_batch <= 1024, "tts.orpheus.max_batch must be in [1, 1024]"),
        (0 <= config.tts.orpheus.batch_timeout_ms <= 200, "tts.orpheus.batch_timeout_ms must be in [0, 200]"),
        (config.tts.orpheus.prompt_format in ("token_ids", "text"), "tts.orpheus.prompt_format must be token_ids or text"),
        (config.tts.orpheus.codec == "in-process" or config.tts.orpheus.codec.startswith(("http://", "https://")),
         "tts.orpheus.codec must be in-process or a codec worker's http(s) URL"),
        (config.asr.beam_size >= 1, "asr.beam_size must be >= 1"),
        (0 <= config.asr.speculate_after_secs, "asr.speculate_after_secs must be >= 0"),
        (0 <= config.asr.encoder_padding_seconds < 30, "asr.encoder_padding_seconds must be in [0, 30)"),
        (config.llm.max_reply_tokens >= 1, "llm.max_reply_tokens must be >= 1"),
        (config.llm.context_tokens >= 256, "llm.context_tokens must be >= 256"),
        (config.llm.max_dialogue_chars >= 200, "llm.max_dialogue_chars must be >= 200"),
        (0.02 <= config.tts.chunk_seconds <= 2.0, "tts.chunk_seconds must be in [0.02, 2]"),
        (40 <= config.tts.max_run_chars <= 1000, "tts.max_run_chars must be in [40, 1000]"),
        (0 <= config.llm.max_reply_sentences <= 20, "llm.max_reply_sentences must be in [0, 20]"),
        (1 <= config.retrieval.top_k <= 20, "retrieval.top_k must be in [1, 20]"),
        (50 <= config.retrieval.max_tokens <= 4000, "retrieval.max_tokens must be in [50, 4000]"),
        (0 < config.retrieval.timeout_ms <= 5000, "retrieval.timeout_ms must be in (0, 5000]"),
        (config.agents.max_prompt_chars >= 100, "agents.max_prompt_chars must be >= 100"),
        (all(seconds > 0 for name, seconds in dataclasses.asdict(config.deadlines).items()
             if name not in _PER_UNIT_DEADLINES)
         and all(getattr(config.deadlines, name) >= 0 for name in _PER_UNIT_DEADLINES),
         "deadlines must be > 0 (deadlines.asr_per_audio_second and llm_first_token_per_1k_prompt_chars "
         "may be 0)"),
        (0 < config.tts.fallback_after_seconds < config.deadlines.tts_first_audio_seconds,
         "tts.fallback_after_seconds must be > 0 and below deadlines.tts_first_audio_seconds"),
        (0 < config.tts.orpheus.fallback_after_seconds < config.deadlines.tts_first_audio_seconds,
         "tts.orpheus.fallback_after_seconds must be > 0 and below deadlines.tts_first_audio_seconds "
         "(the fallback voice needs time to say the sentence)"),
        (config.agents.max_agents >= 1, "agents.max_agents must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def load_config(path: str | Path | None = None, **overrides: Any) -> CadenceConfig:
    """Reads YAML (if given) into `CadenceConfig`; unknown keys and wrong types are errors
    naming the key's path (models/config_loader.py)."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_yaml(path, "config") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a mapping at top level")
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        if key:
            data.setdefault(section, {})[key] = value
        else:  # a top-level key, e.g. deployment
            data[section] = value
    return build_dataclass(CadenceConfig, data, "config")
