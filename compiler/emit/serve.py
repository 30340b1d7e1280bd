"""``nnatlas docs --serve``: the built site served on 127.0.0.1, and nothing but the site.

The handler answers only with regular files whose resolved path lies inside the site folder: a
symlink placed in the folder that points out of it (``/etc/passwd``), a ``..`` that climbs out, a
directory with no ``index.html`` (no listings) are each 404; a path with a NUL byte, bytes that are
not UTF-8 once unquoted, or a backslash is 400. Every answer is one status line, never a traceback.
"""

from __future__ import annotations

import email.utils
import functools
import http.server
import os
import urllib.parse
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import UserError


def bad_path(raw: str) -> str | None:
    """Why a request path is malformed (the text of a 400), or None."""
    path = urllib.parse.urlsplit(raw).path
    try:
        text = urllib.parse.unquote(path, errors="strict")
    except UnicodeDecodeError:
        return "the path is not UTF-8 once unquoted"
    if "\x00" in text:
        return "the path holds a NUL byte"
    if not text.startswith("/") or "\\" in text:
        return "the path is not an absolute URL path"
    return None


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the regular files under ``directory`` (resolved once, when the server is made)."""

    def send_head(self) -> BinaryIO | None:  # type: ignore[override]
        why = bad_path(self.path)
        if why is not None:
            self.send_error(400, f"Bad request: {why}")
            return None
        local = Path(self.translate_path(self.path))
        if local.is_dir():
            if not urllib.parse.urlsplit(self.path).path.endswith("/"):
                return super().send_head()  # the standard redirect to the path with a slash
            local = local / "index.html"
        real = Path(os.path.realpath(local))
        if not (real.is_relative_to(self.directory) and real.is_file()):
            self.send_error(404, "File not found")
            return None
        try:
            f = open(real, "rb")  # noqa: SIM115 (handed to the server, which closes it)
        except OSError:
            self.send_error(404, "File not found")
            return None
        stat = os.fstat(f.fileno())
        self.send_response(200)
        self.send_header("Content-type", self.guess_type(str(real)))
        self.send_header("Content-Length", str(stat.st_size))
        self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
        self.end_headers()
        return f

    def list_directory(self, path: Any) -> None:  # never reached from send_head: no listings
        self.send_error(404, "File not found")
        return None


def bind(port: int, folder: Path) -> Any:
    """An HTTP server of ``folder`` bound to 127.0.0.1:``port`` (never every interface), not yet serving."""
    if not 0 <= port <= 65535:
        raise UserError(f"nnatlas: --port {port} is out of range (0-65535; 0 picks a free port)")
    handler = functools.partial(SiteHandler, directory=os.path.realpath(folder))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as e:
        raise UserError(f"nnatlas: cannot serve on 127.0.0.1:{port}: {e.strerror or e} "
                        "(pick another --port, or --port 0 for a free one)") from None


def serve_on(httpd: Any, folder: Path) -> None:
    """Serve with a server from ``bind`` until interrupted."""
    host, real_port = str(httpd.server_address[0]), httpd.server_address[1]
    print(f"nnatlas: serving {folder} at http://{host}:{real_port}/ (Ctrl-C stops)", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
