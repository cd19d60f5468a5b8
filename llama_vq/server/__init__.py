"""llama-vq-server: llama-server's engine (server-context, in libllama-vq-server) behind FastAPI + uvicorn.

Modules: options (llama-vq's own flags, split from llama-server's), settings (the typed configuration), engine
(the ctypes binding of the engine), bridge (an HTTP request -> a route handler of the engine -> the response,
streamed), security (API keys and CORS as llama-server answers them), metrics (Prometheus), state_dir (the
prompt cache on disk across restarts), app (the FastAPI application), cli (the entry point).
"""

__version__ = "0.2.0"
