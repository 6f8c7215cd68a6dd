"""reflex-adapter: an OpenAI-compatible HTTP sidecar that talks to Reflex engines only over the local
IPC protocol (docs/reference.md, "IPC protocol"). It never imports the engine's compute."""
