"""TCP ports for the server's three services: whether one is taken, and free ones to pick."""

from __future__ import annotations

import socket


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free now: every socket stays bound until all are picked, so the kernel cannot hand
    the same port out twice (picking them one at a time can, and two services on one port cannot start)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def shared_port(ports: dict[str, int]) -> str | None:
    """A sentence naming two services given the same port, or None when every port is its own."""
    seen: dict[int, str] = {}
    for label, port in ports.items():
        if port in seen:
            return f"{seen[port]} and {label} are both given port {port}; each service needs its own"
        seen[port] = label
    return None


# what a server's log says when a port it was given was taken: the CLI's refusal when it starts, tritonserver's when
# another process bound the port while the models loaded (tritonserver binds after loading)
_PORT_TAKEN = ("is already in use", "failed to start HTTP service", "failed to start GRPC service",
               "failed to start Metrics service")


def port_taken(output: str) -> bool:
    """Whether a server that exited did so because one of its ports was taken (another start may get free ones)."""
    return any(sign in output for sign in _PORT_TAKEN)
