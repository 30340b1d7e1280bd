"""The CLI: a user's mistake is one line on stderr and exit status 2, never a traceback; ``docs --out``
writes only a folder nnatlas made or an empty one; a bad or busy port is said before the build."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nnatlas.compiler import GenerateError, UserError, build_site, cli, default_root
from nnatlas.compiler.cli import main, user_errors
from nnatlas.compiler.emit import outdir

ROOT = default_root()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(*args: object, **kwargs: object) -> list[str]:
        raise AssertionError("the site was built before the mistake was said")

    monkeypatch.setattr(cli, "build_site", build)


def test_docs_refuses_a_non_empty_folder_it_did_not_make(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "index.html").write_text("<p>my own page</p>")
    before = sorted(p.name for p in mine.iterdir())
    no_build(monkeypatch)
    code, err = run(["docs", "--out", str(mine)], capsys)
    assert code == 2
    assert err == (f"nnatlas: --out {mine} is a folder nnatlas did not make and it is not empty; refusing to write into "
                   "it (give a new or empty folder; nnatlas marks its own with .nnatlas-site)\n")
    assert sorted(p.name for p in mine.iterdir()) == before
    assert (mine / "thesis.tex").read_text() == "years of work" and (mine / "index.html").read_text() == "<p>my own page</p>"
    with pytest.raises(GenerateError):
        build_site(mine, ROOT)
    assert sorted(p.name for p in mine.iterdir()) == before


def test_docs_refuses_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("keep")
    no_build(monkeypatch)
    assert run(["docs", "--out", str(target)], capsys) == (
        2, f"nnatlas: --out {target} is a file, not a folder; give a new or empty folder\n")
    assert target.read_text() == "keep"


def test_docs_writes_a_new_or_empty_folder_then_reuses_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    written = build_site(empty, ROOT)
    assert "index.html" in written and (empty / outdir.MARKER).is_file()
    out = tmp_path / "new" / "site"
    code, _ = run(["docs", "--out", str(out)], capsys)
    assert code == 0 and (out / "llama.html").is_file() and (out / outdir.MARKER).is_file()
    listed = set(outdir.listed(out))
    assert {"index.html", "llama.html", ".nojekyll"} <= listed
    (out / "mine.txt").write_text("a file of the user's, in nnatlas's folder")
    (out / "gone.html").write_text("an earlier build's page no spec makes now")
    with (out / outdir.MARKER).open("a") as fh:
        fh.write("gone.html\n../outside.txt\n/etc/passwd\n")
    (tmp_path / "new" / "outside.txt").write_text("outside")
    (out / "llama.html").write_text("stale")
    code, _ = run(["docs", "--out", str(out)], capsys)  # `make docs`, again
    assert code == 0
    assert "family llama" in (out / "llama.html").read_text()
    assert not (out / "gone.html").exists()  # its own earlier file, listed: removed
    assert (out / "mine.txt").is_file() and (tmp_path / "new" / "outside.txt").is_file()  # never listed: kept
    assert set(outdir.listed(out)) == listed


def test_a_site_an_older_nnatlas_wrote_is_reused(tmp_path: Path) -> None:
    old = tmp_path / "site"
    build_site(old, ROOT)
    (old / outdir.MARKER).unlink()
    outdir.check(old)  # .nojekyll beside nnatlas's own index.html
    (old / "index.html").write_text("<!doctype html><p>someone else's</p>")
    with pytest.raises(GenerateError, match="did not make"):
        outdir.check(old)


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_said_before_the_build(port: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    no_build(monkeypatch)
    assert run(["docs", "--out", str(tmp_path / "s"), "--serve", "--port", port], capsys) == (
        2, f"nnatlas: --port {port} is out of range (0-65535; 0 picks a free port)\n")
    assert not (tmp_path / "s").exists()


def test_a_busy_port_is_said_before_the_build(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    no_build(monkeypatch)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(["docs", "--out", str(tmp_path / "s"), "--serve", "--port", str(port)], capsys)
    assert code == 2
    assert err == (f"nnatlas: cannot serve on 127.0.0.1:{port}: Address already in use (pick another --port, or "
                   "--port 0 for a free one)\n")


def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["generate", "--root", str(tmp_path / "nowhere")], capsys) == (
        2, f"nnatlas: --root {tmp_path / 'nowhere'} does not exist; give the checkout that holds specs/\n")
    assert run(["docs", "--root", str(tmp_path), "--out", str(tmp_path / "s")], capsys) == (
        2, f"nnatlas: --root {tmp_path} has no specs/ folder; give the checkout that holds specs/\n")
    code, err = run(["docs", "--port", "eighty"], capsys)  # argparse's own message, returned, not exited
    assert code == 2 and "argument --port: invalid int value: 'eighty'" in err
    assert run(["frobnicate"], capsys)[0] == 2


def test_user_errors_helper(capsys: pytest.CaptureFixture[str]) -> None:
    """The one helper every subcommand runs through (new ones too)."""
    def raises(e: BaseException) -> int:
        raise e

    assert user_errors(lambda: raises(UserError("nnatlas: that is not a family"))) == 2
    assert user_errors(lambda: raises(UserError("no prefix"))) == 2
    assert user_errors(lambda: raises(FileNotFoundError(2, "No such file or directory", "/x/y"))) == 2
    assert user_errors(lambda: raises(KeyboardInterrupt())) == 130
    assert user_errors(lambda: 0) == 0
    assert capsys.readouterr().err.splitlines() == [
        "nnatlas: that is not a family", "nnatlas: no prefix", "nnatlas: No such file or directory: /x/y",
        "nnatlas: interrupted"]
    with pytest.raises(ZeroDivisionError):  # a bug in nnatlas keeps its traceback
        user_errors(lambda: 1 // 0)
