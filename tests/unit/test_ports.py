"""Ports for the server's services: distinct free picks, and two services given one port named."""

import socket

from gebackend.server.ports import free_ports, port_in_use, port_taken, shared_port


def test_free_ports_are_distinct_and_free():
    for _ in range(200):  # picked one at a time, two of them can be the same port
        ports = free_ports(3)
        assert len(set(ports)) == 3
    assert not any(port_in_use(port) for port in ports)


def test_a_bound_port_is_in_use():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        assert port_in_use(sock.getsockname()[1])


def test_shared_port_names_both_services():
    assert shared_port({"HTTP": 8000, "gRPC": 8001, "metrics": 8002}) is None
    assert shared_port({"HTTP": 8000, "gRPC": 8000, "metrics": 8002}) == (
        "HTTP and gRPC are both given port 8000; each service needs its own")
    assert "HTTP and metrics" in shared_port({"HTTP": 9, "gRPC": 8, "metrics": 9})


def test_port_taken_reads_the_cli_and_tritonserver_refusals():
    assert port_taken("gebackend: HTTP port 8000 is already in use; choose another with --http-port")
    assert port_taken("E1207 failed to start GRPC service: Unavailable - Socket '0.0.0.0:8001' already in use")
    assert not port_taken("gebackend: model 'x' failed to load: no model file")
