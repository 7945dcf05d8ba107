"""A TCP proxy in front of the S3 server that a test can switch off and on: while off it
cuts every open connection and resets new ones, as an endpoint that went away does (moto
keeps its data in memory, so stopping moto itself would lose the bucket). It can also
``hold`` the traffic, as a server process that is paused (SIGSTOP) does: connections are
accepted and requests read, but nothing passes either way until ``release``."""

import contextlib
import socket
import struct
import threading


class SwitchableProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.refused = 0  # connections reset while the endpoint was down
        self._up = threading.Event()
        self._up.set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._up.clear()
        with self._lock:
            for conn in self._open:
                _close(conn)
            self._open.clear()

    def start(self) -> None:
        self._up.set()

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def _accept_loop(self) -> None:
        while True:
            client, _ = self._listener.accept()
            if not self._up.is_set():
                self.refused += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                _close(client)  # RST: "connection reset by peer"
                continue
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._open += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                pump = (source, target, self._flowing)
                threading.Thread(target=_pump, args=pump, daemon=True).start()


def _pump(source: socket.socket, target: socket.socket, flowing: threading.Event) -> None:
    try:
        while data := source.recv(65536):
            flowing.wait()
            target.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(target)


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.close()
