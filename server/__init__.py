"""llama-vq-server: an OpenAI-compatible HTTP server on llama_vq.Llama.

Modules: settings (configuration), cli (entry point), app (FastAPI app), api_router (routes),
protocol (wire format), serving (requests <-> engine), engine (the model), kv_store (KV state
files), metrics (Prometheus), auth (API keys), errors (OpenAI error bodies).
"""

__version__ = "0.1.0"
