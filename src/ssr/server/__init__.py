"""OpenAI-compatible server: protocol (parsing, shapes), scheduler (one engine worker), app."""
