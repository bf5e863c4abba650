"""Serves build/index over HTTP on localhost: PEP 503 HTML, or PEP 691 JSON when asked for.

Only what is live is served: hidden names (``.versions/`` with its staged and previous versions,
the publish lock) answer 404 and are never listed. What clients send is printed escaped, so a
request line cannot write control sequences into the operator's terminal.
"""

from __future__ import annotations

import functools
import html
import http.server
import io
import os
import urllib.parse
from pathlib import Path

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def printable(text: str) -> str:
    """``text`` with every non-printable character (ESC, CR, BEL, ...) written as an escape."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _hidden(url_path: str) -> bool:
    parts = urllib.parse.unquote(urllib.parse.urlsplit(url_path).path).split("/")
    return any(part.startswith(".") for part in parts if part not in ("", ".", ".."))


class IndexHandler(http.server.SimpleHTTPRequestHandler):
    def send_head(self):  # noqa: ANN201 - the base class's signature
        if _hidden(self.path):
            self.send_error(404, "File not found")
            return None
        path = Path(self.translate_path(self.path))
        if path.is_dir() and JSON_TYPE in self.headers.get("Accept", "") and (path / "index.json").exists():
            self.path = self.path.rstrip("/") + "/index.json"  # PEP 691 content negotiation
        return super().send_head()

    def list_directory(self, path: str | os.PathLike[str]) -> io.BytesIO | None:
        """A plain listing of the visible entries (the base class would list .versions/ too)."""
        try:
            names = sorted(n for n in os.listdir(path) if not n.startswith("."))
        except OSError:
            self.send_error(404, "No permission to list directory")
            return None
        links = "".join(f'<a href="{urllib.parse.quote(n)}{"/" if Path(path, n).is_dir() else ""}">'
                        f"{html.escape(n)}</a><br/>\n" for n in names)
        body = f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def guess_type(self, path: str | Path) -> str:
        return JSON_TYPE if str(path).endswith("index.json") else super().guess_type(path)

    def log_message(self, format: str, *args: object) -> None:
        print(printable(f"{self.address_string()} {format % args}"), flush=True)


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
