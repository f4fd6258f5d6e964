"""Engine adapters: transformers (also used by the embedded server) and vLLM."""
