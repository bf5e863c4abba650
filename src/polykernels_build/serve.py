"""Serves build/index over HTTP on localhost: PEP 503 HTML, or PEP 691 JSON when asked for."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class IndexHandler(http.server.SimpleHTTPRequestHandler):
    def send_head(self):  # noqa: ANN201 - the base class's signature
        path = Path(self.translate_path(self.path))
        if path.is_dir() and JSON_TYPE in self.headers.get("Accept", "") and (path / "index.json").exists():
            self.path = self.path.rstrip("/") + "/index.json"  # PEP 691 content negotiation
        return super().send_head()

    def guess_type(self, path: str | Path) -> str:
        return JSON_TYPE if str(path).endswith("index.json") else super().guess_type(path)

    def log_message(self, format: str, *args: object) -> None:
        print(f"{self.address_string()} {format % args}", flush=True)


def make_server(root: Path, port: int, host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    handler = functools.partial(IndexHandler, directory=str(root))
    return http.server.ThreadingHTTPServer((host, port), handler)


def serve(root: Path, port: int) -> None:
    server = make_server(root, port)
    variants = sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []
    print(f"serving {root} on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    for variant in variants:
        print(f"  pip install --index-url http://127.0.0.1:{server.server_address[1]}/{variant}/simple polykernels")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
