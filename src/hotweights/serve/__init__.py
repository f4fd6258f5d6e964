"""Embedded OpenAI-compatible server (Starlette + uvicorn) over the transformers adapter."""
