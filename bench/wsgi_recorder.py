"""A WSGI middleware that records every Dash callback response: its outputs, the bytes sent and the
server's seconds — what ``bench/dashboard_payload.py`` and ``tests/test_dashboard_payload_bounds.py``
measure the dashboard's responses with. No attnviz import: it wraps any Flask app's ``wsgi_app``.

    recorder = Recorder(app.server.wsgi_app)
    app.server.wsgi_app = recorder        # then recorder.records: one dict per callback request
"""

from __future__ import annotations

import io
import json
import threading
import time


class Recorder:
    """WSGI middleware: for each Dash callback request, its outputs, the bytes answered and the server time."""

    def __init__(self, app) -> None:
        self.app = app
        self.records: list[dict] = []
        self.in_flight = 0
        self.last = time.time()
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        if not environ.get("PATH_INFO", "").endswith("_dash-update-component"):
            return self.app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        status = []

        def start(code, headers, *rest):
            status.append((code, dict(headers)))
            return start_response(code, headers, *rest)

        with self._lock:
            self.in_flight += 1
        t0 = time.perf_counter()
        try:
            result = self.app(environ, start)
            chunks = list(result)
            if hasattr(result, "close"):
                result.close()
        finally:
            seconds = time.perf_counter() - t0
            with self._lock:
                self.in_flight -= 1
                self.last = time.time()
        code, headers = status[0] if status else ("?", {})
        record = {
            "output": str(request.get("output", "")),
            "changed": request.get("changedPropIds", []),
            "bytes": sum(len(c) for c in chunks),
            "seconds": seconds,
            "status": code.split()[0],
            "encoding": headers.get("Content-Encoding", ""),
        }
        with self._lock:
            self.records.append(record)
        return chunks

    def quiet_for(self, seconds: float) -> bool:
        with self._lock:
            return self.in_flight == 0 and time.time() - self.last >= seconds
