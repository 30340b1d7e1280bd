"""``nnatlas docs --serve`` answers with the site's own regular files only: nothing through a symlink out of
the folder, no listing, and a 400 (never a dropped connection and a traceback) for a malformed path."""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnatlas.compiler.emit.serve import bad_path, bind


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    top = tmp_path_factory.mktemp("serve")
    (top / "secret.txt").write_text("outside the site")
    folder = top / "site"
    (folder / "sub").mkdir(parents=True)
    (folder / "bare").mkdir()
    (folder / "index.html").write_text("<p>index</p>")
    (folder / "page.html").write_text("<p>page</p>")
    (folder / "sub" / "index.html").write_text("<p>sub</p>")
    os.symlink("/etc/passwd", folder / "passwd.html")
    os.symlink(top / "secret.txt", folder / "secret.html")
    os.symlink(top, folder / "up")
    os.symlink(folder / "page.html", folder / "alias.html")  # a link that stays inside is served
    httpd = bind(0, folder)
    httpd.RequestHandlerClass.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], folder
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    """The raw request line as written (http.client sends the path unaltered), its status and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize(("path", "status", "body"), [
    ("/", 200, b"<p>index</p>"),
    ("/index.html", 200, b"<p>index</p>"),
    ("/page.html?x=1#y", 200, b"<p>page</p>"),
    ("/alias.html", 200, b"<p>page</p>"),
    ("/sub/", 200, b"<p>sub</p>"),
    ("/sub", 301, None),
])
def test_the_sites_own_files_are_served(site: tuple[int, Path], path: str, status: int, body: bytes | None) -> None:
    code, got = get(site[0], path)
    assert code == status
    if body is not None:
        assert got == body


@pytest.mark.parametrize("path", ["/passwd.html", "/secret.html", "/up/secret.txt", "/../secret.txt",
                                  "/%2e%2e/secret.txt", "/sub/../../secret.txt", "/bare/", "/missing.html"])
def test_nothing_outside_the_folder_and_no_listing(site: tuple[int, Path], path: str) -> None:
    code, body = get(site[0], path)
    assert code == 404
    assert b"root:" not in body and b"outside the site" not in body


@pytest.mark.parametrize("path", ["/%00", "/page.html%00.txt", "/%ff%fe", "/..%5c..%5csecret.txt"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_malformed_path_is_400(site: tuple[int, Path], path: str, method: str) -> None:
    assert get(site[0], path, method)[0] == 400


def test_bad_path_says_why() -> None:
    assert bad_path("/a.html") is None
    assert bad_path("/a%00") == "the path holds a NUL byte"
    assert bad_path("/%c3%28") == "the path is not UTF-8 once unquoted"
