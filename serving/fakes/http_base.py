"""A quiet JSON request handler shared by the loopback fakes."""
from __future__ import annotations

from http.server import BaseHTTPRequestHandler

from agent.jsonio import dumps  # orjson when installed: a real server does not serialise in Python


class JSONHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # keep test output clean
        pass

    def _send(self, code: int, body, ctype: str = "application/json"):
        if isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = dumps(body)
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            if code == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client went away (a probe that timed out)
            pass
