"""The HTTP API (SPEC §6): FastAPI app factory and uvicorn entry point."""

from coordinator.api.app import create_app, serve

__all__ = ["create_app", "serve"]
