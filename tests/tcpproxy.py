"""A TCP proxy on 127.0.0.1 whose connections a test can cut (a network blip) or refuse
for a while (an outage), so a client's connection fails while the server keeps running.

Each accepted connection gets its own connection to the target and two pump threads.
``cut()`` closes every connection through the proxy at once (the client sees its
socket closed and reconnects, through the proxy again); ``refuse()`` makes new
connections close as soon as they are accepted until ``admit()``; ``cut_at_request(key)``
closes the connection that next carries a Kafka request with that API key, before the
request reaches the server (a broker killed with the request in flight). Threads are daemons and
``close()`` ends them all.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, kafka: bool = False) -> None:
        """``kafka``: the traffic is Kafka's, forwarded a request at a time, so that
        ``cut_at_request`` can work (other protocols are pumped as bytes)."""
        self.target = (target_host, target_port)
        self.kafka = kafka
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._refusing = False
        self._closed = False
        self.accepted = 0  # connections admitted so far
        self._cut_keys: dict[int, int] = {}  # API key -> connections still to cut at it
        self.cut_requests: list[int] = []  # the API keys of the requests cut so far
        self._thread = threading.Thread(target=self._accept, name="tcpproxy", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                refuse = self._refusing or self._closed
            if refuse:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
                self.accepted += 1
            threading.Thread(target=self._pump_requests if self.kafka else self._pump,
                             args=(client, server), daemon=True,
                             name="tcpproxy-requests").start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True,
                             name="tcpproxy-pump").start()

    def cut_at_request(self, api_key: int, times: int = 1) -> None:
        """Close the next ``times`` connections that carry a request with ``api_key``, at
        that request (it never reaches the server)."""
        with self._lock:
            self._cut_keys[api_key] = self._cut_keys.get(api_key, 0) + times

    def _pump_requests(self, src: socket.socket, dst: socket.socket) -> None:
        """Client to server, whole Kafka frames at a time (int32 size, int16 API key...),
        so that a frame whose API key is to be cut is never forwarded in part."""
        buf = b""
        try:
            while data := src.recv(65536):
                buf += data
                while len(buf) >= 6:
                    size = int.from_bytes(buf[:4], "big", signed=True)
                    if size < 2:  # not a request: the server's to refuse
                        dst.sendall(buf)
                        buf = b""
                        break
                    if len(buf) < 4 + size:
                        break
                    key = int.from_bytes(buf[4:6], "big", signed=True)
                    with self._lock:
                        cut = self._cut_keys.get(key, 0) > 0
                        if cut:
                            self._cut_keys[key] -= 1
                            self.cut_requests.append(key)
                    if cut:
                        return  # the finally closes both sides
                    dst.sendall(buf[:4 + size])
                    buf = buf[4 + size:]
        except OSError:
            pass
        finally:
            _shutdown(src, dst)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(src, dst)

    def cut(self) -> int:
        """Close every connection through the proxy; how many there were."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        return len(pairs)

    def refuse(self) -> None:
        """Cut every connection and refuse new ones until ``admit``."""
        with self._lock:
            self._refusing = True
        self.cut()

    def admit(self) -> None:
        with self._lock:
            self._refusing = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()
        self._thread.join(5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shutdown(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
