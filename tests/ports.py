"""Loopback ports for the tests that start servers or need an address nobody answers on."""
import socket


def free_port() -> int:
  """A loopback port nobody listens on (at the time of asking)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
