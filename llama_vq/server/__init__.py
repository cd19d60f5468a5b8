"""llama-vq-server: llama-server's engine (server-context, in libllama-vq-server) behind FastAPI + uvicorn.

Modules: options (llama-vq's own flags, split from llama-server's), settings (the typed configuration), engine
(the ctypes binding of the engine), workers (the threads that run engine calls), bridge (an HTTP request -> a
route handler of the engine -> the response, streamed), sse (SSE framing per API), responses (HTTP response
plumbing), middleware (readiness, HEAD, header case), security (API keys, CORS, body limit), protocol (the
request models of the OpenAPI document), metrics (Prometheus), state_dir (the prompt cache on disk across
restarts), app (the FastAPI application), cli (the entry point).
"""

from .. import __version__

__all__ = ["__version__"]
