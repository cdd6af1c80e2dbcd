"""Does HOST:PORT answer as Ray, within a few seconds? A probe before `ray.init`, which retries for minutes.

ray.init against an address that accepts TCP but is not Ray (a web server, a stale port) was still
connecting after 200 s. Ray's GCS (and its client server, `ray://`) speak gRPC, that is HTTP/2 over cleartext
TCP, so one short exchange on one socket tells them apart, with no gRPC library (ray does not install one):
- the server's connection preface must be an HTTP/2 SETTINGS frame (a web server answers `HTTP/1.1 400`,
  SSH and Redis their own banners, a silent one nothing);
- a GCS knows `ray.rpc.NodeInfoGcsService/CheckAlive` (an empty request): it answers with a reply message, or,
  where it wants a token (ray 2.60's local clusters do by default), UNAUTHENTICATED; another gRPC server
  (e.g. a raylet's port given by mistake) ends the call with UNIMPLEMENTED. The status is read where the server
  sends it as a plain HPACK literal (gRPC C-core, Ray's); a Huffman-coded one is not decoded and counts as
  an answer, so the probe never refuses a GCS it cannot read.
The second step is skipped for `ray://` (Ray Client, not the GCS). TLS (RAY_USE_TLS) skips both.
Measured here (ray 2.60, 2 shared cores): an http.server is refused in 3 ms, a raylet's port in 1 ms, a
server that accepts and stays silent at the timeout; a local GCS (token auth on or off) answers in 0.3-1.2 ms.
"""

from __future__ import annotations

import os
import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
UNIMPLEMENTED = 12
CHECK_ALIVE = b"/ray.rpc.NodeInfoGcsService/CheckAlive"


class NotRay(Exception):
    """The address answered, but not as Ray; the message says what it did instead."""


def check(host: str, port: int, timeout: float, *, gcs: bool = True) -> None:
    """Raise OSError when nothing answers at host:port within `timeout` s, NotRay when something else does."""
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        if _truthy("RAY_USE_TLS"):
            return
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0, b""))
        kind, _, stream, _ = _read_frame(sock, deadline, first=True)
        if kind != SETTINGS or stream != 0:
            raise NotRay(f"it answers HTTP/2 but not as gRPC (first frame type {kind})")
        if gcs:
            _call_check_alive(sock, f"{host}:{port}", deadline)


def _call_check_alive(sock: socket.socket, authority: str, deadline: float) -> None:
    """One unary call on stream 1: a reply message (DATA) or any status but UNIMPLEMENTED is a GCS's answer."""
    sock.sendall(_frame(SETTINGS, ACK, 0, b"") + _frame(HEADERS, END_HEADERS, 1, _request_headers(authority))
                 + _frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"))  # the gRPC message: uncompressed, 0 bytes
    answered = False
    while True:
        kind, flags, stream, payload = _read_frame(sock, deadline)
        if kind == HEADERS and stream == 1 and not answered:  # the response's headers; trailers come later
            answered, status = True, _http_status(payload)
            if status not in (None, 200):  # an HTTP/2 proxy or web server, where gRPC always answers 200
                raise NotRay(f"it answers HTTP/2 with status {status}, not as gRPC")
        if kind == DATA and stream == 1:
            return
        if kind == GOAWAY or (stream == 1 and kind == RST_STREAM):
            raise NotRay("it speaks gRPC but ended the call to Ray's GCS service (NodeInfoGcsService/CheckAlive)")
        if kind == HEADERS and stream == 1 and flags & END_STREAM:
            if _grpc_status(payload) == UNIMPLEMENTED:
                raise NotRay("it speaks gRPC but has no Ray GCS service (NodeInfoGcsService/CheckAlive is "
                             "UNIMPLEMENTED there: another Ray port, or another service)")
            return


_STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}  # HPACK's static table


def _http_status(block: bytes) -> int | None:
    """The :status of a response's headers where it comes first as an HPACK static-table index (every server
    seen does so); None where it is coded otherwise (not refused: the probe never refuses what it cannot read)."""
    i = 0
    while i < len(block) and block[i] & 0xE0 == 0x20:  # dynamic table size updates (one byte when small)
        i += 1
    return _STATIC_STATUS.get(block[i] & 0x7F) if i < len(block) and block[i] & 0x80 else None


def _grpc_status(block: bytes) -> int | None:
    """grpc-status from a trailers block, where it is a plain literal; None where it is coded otherwise."""
    at = block.find(b"\x0bgrpc-status")
    if at < 0 or at + 12 >= len(block) or block[at + 12] & 0x80:  # absent, or its value Huffman-coded
        return None
    n = block[at + 12]
    value = block[at + 13:at + 13 + n]
    return int(value) if value.isdigit() else None


def _request_headers(authority: str) -> bytes:
    """HPACK: :method POST, :scheme http (static table), :path, :authority, content-type, te as literals."""
    return (b"\x83\x86" + b"\x04" + _string(CHECK_ALIVE) + b"\x01" + _string(authority.encode())
            + b"\x0f\x10" + _string(b"application/grpc") + b"\x00" + _string(b"te") + _string(b"trailers"))


def _string(value: bytes) -> bytes:
    if len(value) >= 127:  # a longer authority would need HPACK's multi-byte length; no Ray address is that long
        raise NotRay("the address is too long to probe")
    return bytes([len(value)]) + value


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _read_frame(sock: socket.socket, deadline: float, *, first: bool = False) -> tuple[int, int, int, bytes]:
    head = _read(sock, 9, deadline)
    if first and not head.startswith(b"\0"):  # an HTTP/2 frame this early is a small SETTINGS: length < 2**16
        raise NotRay(f"it does not speak gRPC (it answered {_shown(head + _peek(sock))})")
    length = int.from_bytes(head[:3], "big")
    if length > 1 << 20:
        raise NotRay(f"it does not speak gRPC (a {length}-byte frame)")
    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, _read(sock, length, deadline)


def _read(sock: socket.socket, n: int, deadline: float) -> bytes:
    got = b""
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotRay("it accepted a connection but sent no answer in time" if not got else
                         f"it stopped mid-answer ({_shown(got)})")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(got))
        except TimeoutError:
            continue
        except OSError as e:
            raise NotRay(f"it closed the connection ({e.strerror or e})") from None
        if not chunk:
            raise NotRay("it closed the connection without an answer" if not got else
                         f"it closed the connection after {_shown(got)}")
        got += chunk
    return got


def _peek(sock: socket.socket) -> bytes:
    sock.settimeout(0.2)
    try:
        return sock.recv(40)
    except OSError:
        return b""


def _shown(data: bytes) -> str:
    return repr(" ".join(data[:40].decode("ascii", "replace").split()))


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")
