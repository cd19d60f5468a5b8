"""The threads that run engine calls, in two pools, so that control routes never wait behind generation.

A route handler of llama-server's engine blocks its thread until it has answered: for a completion that is not
streamed, until the generation ends; a stream's, until its headers (a C++ thread of the call then writes its
bytes: bridge.py). The event loop never runs them;
it awaits them on these threads.

- control (CONTROL_THREADS): the routes that answer from the engine's state or from one high-priority task of the
  task loop, never waiting for a slot (/health, /metrics, /slots, /props, /models, tokenize, templates, token
  counts), and every call's creation and release. A generation never holds one of these threads, so they
  answer within milliseconds however many generations are in flight.
- generation (up to GENERATION_THREADS): every handler that may wait for a slot or a token (completions, chat,
  responses, messages, infill, embeddings, rerank, slot save/restore). As llama-server's
  HTTP pool (n_threads_http fixed threads plus up to 1024 made on demand), a request in flight holds a thread;
  threads are made on demand and stay for reuse.
"""

from __future__ import annotations

import concurrent.futures as cf

from .engine import Route

CONTROL_THREADS = 8
GENERATION_THREADS = 1024

CONTROL_ROUTES = frozenset(
    {
        ("GET", "/health"),
        ("GET", "/v1/health"),
        ("GET", "/metrics"),
        ("GET", "/props"),
        ("POST", "/props"),
        ("GET", "/models"),
        ("GET", "/v1/models"),
        ("GET", "/slots"),
        ("GET", "/lora-adapters"),
        ("GET", "/tools"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/apply-template"),
        ("POST", "/chat/completions/input_tokens"),
        ("POST", "/v1/chat/completions/input_tokens"),
        ("POST", "/responses/input_tokens"),
        ("POST", "/v1/responses/input_tokens"),
        ("POST", "/v1/messages/count_tokens"),
    }
)


class Workers:
    def __init__(self) -> None:
        self.control = cf.ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="llama-vq-control")
        self.generation = cf.ThreadPoolExecutor(GENERATION_THREADS, thread_name_prefix="llama-vq-generation")

    def for_route(self, route: Route) -> cf.ThreadPoolExecutor:
        return self.control if (route.method, route.path) in CONTROL_ROUTES else self.generation

    def shutdown(self) -> None:
        for pool in (self.control, self.generation):
            pool.shutdown(wait=False, cancel_futures=True)
