"""Embedded OpenAI-compatible server (FastAPI + uvicorn) over the transformers adapter."""
