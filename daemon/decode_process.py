"""The decode worker's process (daemon/decoding.py): it answers each batch of decision
events sent on its socket with their envelopes, until the daemon closes the socket or dies.

It imports only what reading needs (no metrics, logging or event loop), so it is up in a
fraction of the daemon's own start-up: its whole start is CPU a backlog's catch-up pays.
Run as ``python -m vigil.daemon.decode_process FD``, FD the inherited socket.
"""

from __future__ import annotations

import pickle
import signal
import socket
import struct
import sys
from typing import Any

from vigil.connectors.events import read_envelopes

_LENGTH = struct.Struct("!Q")


def send(sock: socket.socket, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def receive(sock: socket.socket) -> Any:
    """The next message; ``EOFError`` once the other end is closed."""
    (size,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    return pickle.loads(_exactly(sock, size))


def _exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:  # one call, unless a signal interrupts it
        n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        if n == 0:
            raise EOFError("the other end of the socket is closed")
        got += n
    return buffer


def serve(sock: socket.socket) -> None:
    """Answer each batch of values with its envelopes until the socket closes. Signals to
    the daemon's process group (Ctrl-C, a service manager's stop) are left to the daemon,
    which ends the worker itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        try:
            send(sock, read_envelopes(receive(sock)))
        except (EOFError, OSError):  # the daemon closed its end, or died mid-batch
            return


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
