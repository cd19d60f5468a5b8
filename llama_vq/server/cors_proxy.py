"""/cors-proxy, llama-server's CORS proxy for the web UI's MCP clients (server-cors-proxy.h, experimental upstream).

With --ui-mcp-proxy, `GET|POST /cors-proxy?url=http(s)://host[:port]/path` sends the request on to that URL and
streams its answer back (status, headers and body; redirects followed), so that a browser page can reach an MCP
server that sends no CORS headers. Only headers named `X-Llama-Server-Proxy-Header-<name>` are forwarded, as
`<name>`: the client's own Authorization, X-Api-Key or cookies never leave. The answer's own CORS, framing and
Server headers are dropped (this server adds its own). Without --ui-mcp-proxy the route is a 403, as
llama-server's. Behind the API key like every route.
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .responses import JSON_TYPE, error_body
from .workers import Workers

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600  # llama-server's proxy: 10 minutes to connect, read and write
MAX_REDIRECTS = 10
CHUNK = 64 * 1024
_STRIP = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection", "content-type"})
_DISABLED = b'{"error": {"message": "this feature is disabled", "type": "feature_disabled"}}'


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # with its query string


def _stripped(name: str) -> bool:
    """Answer headers not passed on: framing, Server, and CORS (this server adds its own)."""
    return name in _STRIP or name.startswith("access-control-")


def parse_target(url: str) -> Target:
    """The URL to proxy to; ValueError (llama-server's message) for what it refuses."""
    u = urlsplit(url)
    if not u.hostname:
        raise ValueError("invalid target URL: missing host")
    if u.password:
        raise ValueError("authentication in target URL is not supported")
    if u.scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme in target URL: {u.scheme}")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return Target(u.scheme, u.hostname, u.port or (443 if u.scheme == "https" else 80), path)


def forwarded_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
    """Only the X-Llama-Server-Proxy-Header-<name> headers, as <name> (Accept-Encoding dropped: the body goes
    through as the client would decode it)."""
    out = {}
    for key, value in headers:
        if key.lower().startswith(PREFIX) and len(key) > len(PREFIX):
            name = key[len(PREFIX) :]
            if name.lower() not in ("accept-encoding", "transfer-encoding", "content-length"):
                out[name] = value
    return out


def _open(method: str, target: Target, headers: dict[str, str], body: bytes) -> http.client.HTTPResponse:
    """Send the request (following redirects, as llama-server's client does); the answer's body is unread."""
    for _ in range(MAX_REDIRECTS + 1):
        if target.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                target.host, target.port, timeout=TIMEOUT_S, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(target.host, target.port, timeout=TIMEOUT_S)
        conn.request(method, target.path, body=body if method == "POST" else None, headers=headers)
        resp = conn.getresponse()
        location = resp.getheader("Location")
        if resp.status in (301, 302, 303, 307, 308) and location:
            resp.read()
            conn.close()
            base = f"{target.scheme}://{target.host}:{target.port}{target.path}"
            target = parse_target(urljoin(base, location))
            if resp.status == 303:
                method, body = "GET", b""
            continue
        return resp
    raise OSError("too many redirects")


class CorsProxy:
    def __init__(self, enabled: bool, workers: Workers) -> None:
        self.enabled = enabled
        self.workers = workers

    async def handle(self, request: Request) -> Response:
        if not self.enabled:
            return Response(_DISABLED, 403, media_type=JSON_TYPE.decode())
        try:
            target = parse_target(request.query_params.get("url", ""))
        except ValueError as e:
            return Response(error_body(500, str(e), "server_error"), 500, media_type=JSON_TYPE.decode())
        headers = forwarded_headers(list(request.headers.items()))
        body = await request.body() if request.method == "POST" else b""
        loop = asyncio.get_running_loop()
        try:
            resp = await loop.run_in_executor(self.workers.generation, _open, request.method, target, headers, body)
        except (OSError, http.client.HTTPException, ValueError) as e:
            return Response(f"proxy error: {e}".encode(), 500, media_type="text/plain")
        out_headers = {k: v for k, v in resp.getheaders() if not _stripped(k.lower())}
        ctype = resp.getheader("Content-Type")
        if resp.status in (204, 304) or request.method == "HEAD":
            resp.close()
            return Response(b"", resp.status, headers=out_headers, media_type=ctype)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while True:
                    data = await loop.run_in_executor(self.workers.generation, resp.read1, CHUNK)
                    if not data:
                        return
                    yield data
            finally:
                resp.close()

        return StreamingResponse(chunks(), resp.status, headers=out_headers, media_type=ctype)
