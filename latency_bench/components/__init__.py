"""Per-component benches: one model or one path measured alone (embedder, retrieval, transcription, TTS memory,
worker hop, Whisper workspace, GC pauses, the WebRTC path, the SNAC codec)."""
