"""The round-robin proxy in front of bench/scale_out.py's replicas: HAProxy where installed, else an aiohttp one.

Both spread requests over the replicas' HTTP ports round-robin, as a Kubernetes Service does per connection; both
listen on 127.0.0.1 only. The aiohttp proxy runs as its own process: `python bench/round_robin_proxy.py PORT
UPSTREAM,UPSTREAM,...`.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
from pathlib import Path

FORWARDED = ("Content-Type", "Inference-Header-Content-Length")


def run_proxy(port: int, upstreams: list[str]) -> None:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    async def main() -> None:
        session = ClientSession(connector=TCPConnector(limit=0, keepalive_timeout=30), timeout=ClientTimeout(total=60))
        targets = itertools.cycle(upstreams)

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
            try:
                async with session.request(request.method, next(targets) + request.path_qs, data=body,
                                           headers=headers) as response:
                    data = await response.read()
                    out = {k: v for k, v in response.headers.items() if k in FORWARDED}
                    return web.Response(body=data, status=response.status, headers=out)
            except Exception as exc:  # noqa: BLE001 - an upstream that is gone: 502, as a proxy says it
                return web.Response(status=502, text=f"upstream: {type(exc).__name__}: {exc}")

        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()
        await session.close()

    asyncio.run(main())


def haproxy_config(port: int, upstreams: list[str]) -> str:
    servers = "\n".join(f"  server r{i} {u.split('//', 1)[1]}" for i, u in enumerate(upstreams))
    return f"""global
  maxconn 4096
  nbthread 1
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
frontend gebackend
  bind 127.0.0.1:{port}
  default_backend replicas
backend replicas
  balance roundrobin
  http-reuse always
{servers}
"""


def start_proxy(kind: str, port: int, upstreams: list[str], folder: Path) -> subprocess.Popen:
    """HAProxy (Debian's, a C event loop: least of the cores it shares with the replicas) or the aiohttp proxy."""
    if kind == "haproxy":
        config = folder / f"haproxy-{port}.cfg"
        config.write_text(haproxy_config(port, upstreams))
        return subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL)
    return subprocess.Popen([sys.executable, __file__, str(port), ",".join(upstreams)])


if __name__ == "__main__":
    run_proxy(int(sys.argv[1]), sys.argv[2].split(","))
