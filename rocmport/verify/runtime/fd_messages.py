"""One request over a Unix socket: its JSON body's length (8 bytes, network order) with file
descriptors riding on it (SCM_RIGHTS), then the body. Both requests the rank server takes are these:
a run of ranks (rocmport.verify.runtime.rank_client: its stdout and stderr ride along; it writes the
framing itself, as a bare script started with -I) and a process a rank starts with spawn
(served_spawn: the child's status pipe and the descriptors its pickle names)."""

from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct("!Q")


def send(sock: socket.socket, message: dict, fds: list[int]) -> None:
    body = json.dumps(message).encode()
    socket.send_fds(sock, [HEADER.pack(len(body))], fds)
    sock.sendall(body)


def receive(conn: socket.socket, max_fds: int) -> tuple[dict, list[int]]:
    """The request and the descriptors that rode on it (at most ``max_fds``); ConnectionError when the
    peer closes mid-request, ValueError when the body is not JSON."""
    header, fds, _, _ = socket.recv_fds(conn, HEADER.size, max_fds)
    if len(header) < HEADER.size:
        header += _recv_exactly(conn, HEADER.size - len(header))
    (length,) = HEADER.unpack(header)
    return json.loads(_recv_exactly(conn, length)), fds


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection mid-request")
        data += chunk
    return data
