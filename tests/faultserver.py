"""A threaded HTTP server on 127.0.0.1 serving good shards and the faults a real network produces.

Paths (each serves ``files[name]``; the fault decides how):

- ``/good/NAME``: the bytes, with Range support (206), as object stores and web servers serve them;
- ``/closed/NAME``: the full Content-Length, half the body, then the connection closed;
- ``/long/NAME``: a Content-Length 1000 bytes above the body, the body, then closed;
- ``/stall/NAME``: half the body, then nothing with the socket open (until the server stops);
- ``/flaky/NAME``: HTTP 500 for the first request of the path, then as ``/good``;
- ``/droponce/NAME``: the first GET closes after half the body, later ones as ``/good`` (a resumed range);
- ``/missing/NAME``: 404; ``/loop/NAME``: a redirect to itself, forever;
- ``/gzip/NAME``: the plain bytes labelled ``Content-Encoding: gzip`` (they are not gzip).
"""

from __future__ import annotations

import contextlib
import http.server
import threading


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        server = self.server
        _, fault, name = self.path.split("?")[0].split("/", 2)
        data = server.files.get(name)
        with server.lock:
            server.requests[self.path] = server.requests.get(self.path, 0) + 1
            first = server.requests[self.path] == 1
        if data is None or fault == "missing":
            return self._status(404, "Not Found")
        if fault == "loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if fault == "flaky" and first:
            return self._status(500, "Internal Server Error")
        if fault == "droponce" and body:
            with server.lock:
                server.requests["GET " + self.path] = server.requests.get("GET " + self.path, 0) + 1
                fault = "closed" if server.requests["GET " + self.path] == 1 else "good"
        if fault in ("good", "flaky", "droponce") and body and self.headers.get("Range"):
            first, _, last = self.headers["Range"].split("=")[1].partition("-")
            start, end = int(first), min(int(last) + 1 if last else len(data), len(data))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            self.wfile.write(data[start:end])
            return
        declared = len(data) + (1000 if fault == "long" else 0)
        self.send_response(200)
        self.send_header("Content-Length", str(declared))
        self.send_header("Accept-Ranges", "bytes")
        if fault == "gzip":
            self.send_header("Content-Encoding", "gzip")
        if fault in ("closed", "long", "stall"):
            self.send_header("Connection", "close")
        self.end_headers()
        if not body:
            return
        if fault in ("closed", "stall"):
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            if fault == "stall":
                server.stop.wait(60)
            self.close_connection = True
            return
        self.wfile.write(data)
        if fault == "long":
            self.close_connection = True

    def _status(self, code: int, message: str) -> None:
        self.send_response(code, message)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that gives up on a faulty body resets its connection: expected here


@contextlib.contextmanager
def fault_server(files: dict[str, bytes]):
    """Serve ``files`` (name -> bytes); yields the base URL ``http://127.0.0.1:PORT``."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.files = files
    server.requests = {}
    server.lock = threading.Lock()
    server.stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
