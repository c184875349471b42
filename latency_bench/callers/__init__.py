"""Synthetic callers: speech, what a caller hears, and one caller per transport (phone, WebRTC, Realtime)."""
