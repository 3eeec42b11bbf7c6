"""The socket between the runner (child.py, which loads the candidate) and the checker (checker.py).

One AF_UNIX SOCK_SEQPACKET pair made by the parent before either process starts: message
boundaries are kept and a file descriptor (an arena, shared_mem.py) rides on the message it
belongs to.  Every message is one JSON object.  The runner asks, the checker answers; the
checker takes nothing in a message as true beyond "the runner says it is at this step", and
a message it does not expect ends the run (checker.Violation).

Loaded by path (stdlib only).
"""

from __future__ import annotations

import json
import os
import socket

ENV_FD = "PORTER_CHECKER_FD"
MAX_MESSAGE = 1 << 16  # requests and replies are small: case ids, indices, a few timings
MAX_FDS = 4


class LinkClosed(Exception):
    """The other side is gone, or sent something that is not a message."""


class Link:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    def from_env(cls) -> "Link | None":
        fd = os.environ.get(ENV_FD)
        if not fd:
            return None
        return cls(socket.socket(fileno=int(fd)))

    def send(self, msg: dict, fds: list[int] = ()) -> None:
        data = json.dumps(msg).encode()
        if len(data) > MAX_MESSAGE:
            raise LinkClosed(f"message of {len(data)} bytes")
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.sendall(data)
        except OSError as exc:
            raise LinkClosed(f"send: {exc}") from None

    def recv(self, timeout: float | None = None) -> tuple[dict, list[int]]:
        self.sock.settimeout(timeout)
        try:
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
        except (OSError, socket.timeout) as exc:
            raise LinkClosed(f"recv: {exc}") from None
        if not data:
            for fd in fds:
                os.close(fd)
            raise LinkClosed("closed")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            raise LinkClosed("truncated message")
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            for fd in fds:
                os.close(fd)
            raise LinkClosed("not a JSON object")
        return msg, list(fds)

    def ask(self, msg: dict, timeout: float | None = None) -> tuple[dict, list[int]]:
        """Send a request, return the reply (the runner's side)."""
        self.send(msg)
        reply, fds = self.recv(timeout)
        if not reply.get("ok"):
            raise LinkClosed(f"checker refused {msg.get('op')}: {reply.get('error', 'no reason')}")
        return reply, fds

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def pair() -> tuple[socket.socket, socket.socket]:
    """(checker end, runner end); inheritable so Popen(pass_fds=...) hands each to its process."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.set_inheritable(True)
    b.set_inheritable(True)
    return a, b
