"""CPU stand-ins for the Orpheus voice: a tiny random-weight GGUF for llama.cpp and a token server (dev_server)."""
