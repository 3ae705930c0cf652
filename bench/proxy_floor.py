"""The floor of a Python gateway on this machine: a bare aiohttp reverse proxy.

    python bench/proxy_floor.py --port 8100 --upstream http://127.0.0.1:8010

It forwards every POST to the same path on the upstream (body and status as they are, no
parsing, no recording, one connection pool) on uvloop, the event loop the gateway runs on. The
gateway benchmark (``bench/gateway.py``) runs it beside the gateway and the direct path, so that
what the gateway adds can be split into what any aiohttp proxy in one Python process costs here
(this floor) and what trajstream's own work costs (routing, parsing, recording).
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

PASSED = ("Content-Type", "Authorization")


def build(upstream: str, max_connections: int = 256) -> web.Application:
    app = web.Application()
    session: dict[str, aiohttp.ClientSession] = {}

    async def open_session(app: web.Application) -> None:
        session["s"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit_per_host=max_connections)
        )

    async def close_session(app: web.Application) -> None:
        await session["s"].close()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {h: request.headers[h] for h in PASSED if h in request.headers}
        async with session["s"].post(
            upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            data = await answer.read()
            return web.Response(
                status=answer.status,
                body=data,
                headers={"Content-Type": answer.headers.get("Content-Type", "application/json")},
            )

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_get("/healthz", health)
    app.router.add_post("/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        loop_factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(
            web._run_app(
                build(args.upstream.rstrip("/")),
                host="127.0.0.1",
                port=args.port,
                print=None,
                access_log=None,
            )
        )


if __name__ == "__main__":
    main()
