"""A cache folder is data nnatlas checks, never trusts: a tampered folder (more than 20 kinds of damage)
raises one CacheError naming the file, never serves a row; --resume keeps only the shards its journal
vouches for; one run at a time holds --out; a full disk or a read-only folder is one line, exit 2,
nothing left behind, and the folder resumes; shards follow the umask; the rows feed a DataLoader."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import nnatlas
from nnatlas import CacheError
from nnatlas.cache.store import ShardWriter
from nnatlas.cli import cache as cache_cli

from .test_cache_cli import cache, data, files, saved  # noqa: F401 (fixtures)

ARGV = ["--values", "layer_output,logits", "--layers", "0,2", "--batch-size", "3", "--seq-len", "12",
        "--shard-size", "0.02"]


def run(argv: list[str]) -> int:
    return cache_cli.main(argv)


@pytest.fixture(scope="module")
def whole(saved: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """One finished run, never stopped: the folder every test copies or compares against."""
    out = tmp_path_factory.mktemp("cache") / "whole"
    assert run(cache(saved, data, out, *ARGV)) == 0
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) >= 4
    return out


@pytest.fixture(scope="module")
def other(saved: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """Another run (another --batch-size): shards of the same shapes and sizes, another run id."""
    out = tmp_path_factory.mktemp("cache") / "other"
    assert run(cache(saved, data, out, *ARGV, "--batch-size", "4")) == 0
    return out


def shard(folder: Path, k: int) -> Path:
    return folder / f"shard-000-{k:05d}.safetensors"


def edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], None]:
    def damage(folder: Path, other: Path) -> None:
        m = json.loads((folder / "manifest.json").read_text())
        change(m)
        (folder / "manifest.json").write_text(json.dumps(m))
    return damage


def write(name: str, content: bytes) -> Callable[[Path, Path], None]:
    return lambda folder, other: (folder / name).write_bytes(content)


def swap(folder: Path, other: Path) -> None:
    a, b = shard(folder, 0), shard(folder, 1)
    a.rename(folder / "x")
    b.rename(a)
    (folder / "x").rename(b)


def truncate(k: int, size: int | None = None, cut: int = 0) -> Callable[[Path, Path], None]:
    def damage(folder: Path, other: Path) -> None:
        p = shard(folder, k)
        os.truncate(p, size if size is not None else p.stat().st_size - cut)
    return damage


def patch_bytes(k: int, at: int | None, new: bytes, old: bytes | None = None) -> Callable[[Path, Path], None]:
    """Overwrite bytes of shard k: at an offset (negative: from the end), or in place of ``old``."""
    def damage(folder: Path, other: Path) -> None:
        p = shard(folder, k)
        raw = bytearray(p.read_bytes())
        i = raw.index(old) if old is not None else (at if at is not None and at >= 0 else len(raw) + (at or 0))
        raw[i:i + len(new)] = new
        p.write_bytes(bytes(raw))
    return damage


def flip(k: int, at: int) -> Callable[[Path, Path], None]:
    def damage(folder: Path, other: Path) -> None:
        p = shard(folder, k)
        raw = bytearray(p.read_bytes())
        raw[at] ^= 0x01
        p.write_bytes(bytes(raw))
    return damage


def link_out(folder: Path, other: Path) -> None:
    outside = folder.parent / "outside.safetensors"
    shutil.copy(shard(folder, 1), outside)  # even the very bytes, when they lie outside the folder
    shard(folder, 1).unlink()
    shard(folder, 1).symlink_to(outside)


def another_runs_shard(folder: Path, other: Path) -> None:
    assert shard(other, 0).stat().st_size == shard(folder, 0).stat().st_size  # (only the run id differs)
    shutil.copy(shard(other, 0), shard(folder, 0))


def extra_tensor(folder: Path, other: Path) -> None:
    """Shard 0 rewritten with its own metadata, one tensor more, and the manifest's size fixed to match."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    p = shard(folder, 0)
    with safe_open(str(p), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    tensors["meta.extra"] = torch.zeros(tensors["meta.doc"].shape[0])
    save_file(tensors, str(p), metadata=meta)
    edit(lambda m: m["shards"][0].update(bytes=p.stat().st_size))(folder, other)


def first_value(m: dict[str, Any]) -> dict[str, Any]:
    return m["layouts"][m["values"][0]]  # type: ignore[no-any-return]


def more_rows(m: dict[str, Any]) -> None:
    m["rows"] += 1
    m["shards"][-1]["rows"][1] += 1


S0, S1, S2, MANIFEST = "shard-000-00000", "shard-000-00001", "shard-000-00002", "manifest.json"
# (name, damage, verify, what the error names, words of the error)
TAMPER: list[tuple[str, Callable[[Path, Path], None], str, str, str]] = [
    ("manifest-missing", lambda f, o: (f / MANIFEST).unlink(), "header", "has no manifest.json", "did not finish"),
    ("manifest-not-json", write(MANIFEST, b'{"format": '), "header", MANIFEST, "not JSON"),
    ("manifest-not-utf8", write(MANIFEST, b"\xff\xfe{}"), "header", MANIFEST, "not UTF-8"),
    ("manifest-a-list", write(MANIFEST, b"[]"), "header", MANIFEST, "not a valid manifest"),
    ("manifest-format-1", edit(lambda m: m.update(format="nnatlas-cache/1")), "header", MANIFEST, "run nnatlas cache again"),
    ("manifest-unknown-key", edit(lambda m: m.update(extra=1)), "header", MANIFEST, "unknown key 'extra'"),
    ("manifest-missing-key", edit(lambda m: m.pop("rows")), "header", MANIFEST, "no 'rows'"),
    ("manifest-wrong-type", edit(lambda m: m.update(rows=str(m["rows"]))), "header", MANIFEST, "is not an integer"),
    ("manifest-bool-for-int", edit(lambda m: m["shards"][0].update(rank=False)), "header", MANIFEST, "not an integer"),
    ("shard-name-parent", edit(lambda m: m["shards"][0].update(file="../other/shard-000-00000.safetensors")),
     "header", MANIFEST, "is not a shard name"),
    ("shard-name-absolute", edit(lambda m: m["shards"][0].update(file="/etc/passwd")), "header", MANIFEST,
     "is not a shard name"),
    ("shard-name-dev-zero", edit(lambda m: m["shards"][1].update(file="/dev/zero")), "header", MANIFEST,
     "is not a shard name"),
    ("shard-listed-twice", edit(lambda m: m["shards"].__setitem__(1, m["shards"][0])), "header", MANIFEST,
     "listed twice"),
    ("shard-dropped", edit(lambda m: m["shards"].pop()), "header", MANIFEST, "but the shards hold"),
    ("shard-negative-bytes", edit(lambda m: m["shards"][0].update(bytes=-1)), "header", MANIFEST, "below 8"),
    ("values-not-layouts", edit(lambda m: m["values"].reverse()), "header", MANIFEST, "not the values of layouts"),
    ("unknown-dtype", edit(lambda m: first_value(m).update(dtype="complex64")), "header", MANIFEST,
     "not a dtype a shard stores"),
    ("more-rows", edit(more_rows), "header", "shard-000-0", "has shape"),
    ("another-dtype", edit(lambda m: first_value(m).update(dtype="float16")), "header", S0, "the manifest says float16"),
    ("another-row-shape", edit(lambda m: first_value(m).update(row_shape=[first_value(m)["row_shape"][0] // 2])),
     "header", S0, "has shape"),
    ("another-run-id", edit(lambda m: m.update(run_id="0" * 64)), "header", S0, "a shard of another run"),
    ("shards-swapped", swap, "header", S0, "under another shard's name"),
    ("shard-of-another-run", another_runs_shard, "header", S0, "a shard of another run"),
    ("shard-link-out", link_out, "header", S1, "a link out of"),
    ("shard-missing", lambda f, o: shard(f, 2).unlink(), "header", S2, "missing"),
    ("shard-a-folder", lambda f, o: (shard(f, 2).unlink(), shard(f, 2).mkdir()), "header", S2, "not a regular file"),
    ("shard-truncated-1000", truncate(1, 1000), "header", S1, "cut short"),
    ("shard-cut-one-byte", truncate(1, cut=1), "header", S1, "cut short"),
    ("shard-empty", truncate(1, 0), "header", S1, "cut short"),
    ("header-length-huge", patch_bytes(0, 0, struct.pack("<Q", 1 << 40)), "header", S0, "its header claims"),
    ("header-not-json", patch_bytes(0, 8, b"#"), "header", S0, "header is not JSON"),
    ("tensor-renamed", patch_bytes(0, None, b'"meta.dog"', old=b'"meta.doc"'), "header", S0, "differ from the manifest"),
    ("extra-tensor", extra_tensor, "header", S0, "not in the manifest: ['meta.extra']"),
    ("bits-flipped", flip(1, -3), "content", S1, "its bytes changed"),
    ("manifest-sha256", edit(lambda m: m["shards"][2].update(sha256="f" * 64)), "content", S2, "its sha256 is"),
]


@pytest.mark.parametrize(("damage", "verify", "names", "words"), [t[1:] for t in TAMPER], ids=[t[0] for t in TAMPER])
def test_a_tampered_cache_is_one_cache_error(whole: Path, other: Path, tmp_path: Path, damage: Callable[[Path, Path], None],
                                            verify: str, names: str, words: str) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(whole, folder)
    assert len(nnatlas.Cache.load(folder, verify="content")) > 0  # (whole, as copied)
    damage(folder, other)
    with pytest.raises(CacheError) as caught:
        nnatlas.Cache.load(folder, verify=verify)
    message = str(caught.value)
    assert names in message and words in message, message
    assert "\n" not in message


def test_the_manifest_reports_every_problem_at_once(whole: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(whole, folder)
    edit(lambda m: m.update(rows=-1, seq_len="12", bogus=True, shards=[{**m["shards"][0], "file": "../x"}]))(folder, folder)
    with pytest.raises(CacheError) as caught:
        nnatlas.Cache.load(folder)
    for words in ("unknown key 'bogus'", "seq_len: '12' is not an integer", "rows: -1 is below 0",
                  "shards[0].file: '../x' is not a shard name"):
        assert words in str(caught.value)


def test_verify_is_header_or_content(whole: Path) -> None:
    with pytest.raises(CacheError, match="verify='all'"):
        nnatlas.Cache.load(whole, verify="all")
    assert nnatlas.Cache.load(whole).manifest["run_id"] == nnatlas.Cache.load(whole, verify="content").manifest["run_id"]


class Stop(Exception):
    """The injected failure: the process dies here."""


def stop_at(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """ShardWriter.write raises Stop at its n-th shard (0-based)."""
    write = ShardWriter.write
    count = {"n": 0}

    def dying(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        if count["n"] == n:
            raise Stop
        count["n"] += 1
        write(path, tensors, metadata)

    monkeypatch.setattr(ShardWriter, "write", staticmethod(dying))


def test_resume_keeps_only_the_shards_its_journal_vouches_for(saved: Path, data: Path, whole: Path, other: Path,  # noqa: F811
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        stop_at(m, 3)
        with pytest.raises(Stop):
            run(cache(saved, data, out, *ARGV))
    shutil.copy(shard(other, 0), shard(out, 0))  # another run's shard under a finished shard's name
    os.truncate(shard(out, 1), 1000)  # a finished shard cut short
    assert run(cache(saved, data, out, *ARGV, "--resume")) == 0
    assert files(out) == files(whole)
    nnatlas.Cache.load(out, verify="content")


def test_one_run_at_a_time_holds_the_folder(saved: Path, data: Path, whole: Path, tmp_path: Path,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A second run (--resume) on --out while the first writes its shards: refused, naming the holder."""
    out = tmp_path / "out"
    write = ShardWriter.write
    second: list[int] = []
    started: list[bool] = []

    def racing(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        if not started:  # once: the first shard of the first run
            started.append(True)
            second.append(run(cache(saved, data, out, *ARGV, "--resume")))
        write(path, tensors, metadata)

    monkeypatch.setattr(ShardWriter, "write", staticmethod(racing))
    assert run(cache(saved, data, out, *ARGV)) == 0
    assert second == [2]
    err = capsys.readouterr().err
    assert f"is in use by another nnatlas cache run (pid {os.getpid()})" in err
    assert files(out) == files(whole)  # (the lock is gone with the run)


def no_space(real: Callable[..., Any], when: Callable[[str], bool], path_at: int) -> Callable[..., Any]:
    """``real`` failing as a full disk does (half a file written, then ENOSPC) for the files ``when``
    picks by name; ``path_at``: which argument is the file."""
    def full(*args: Any, **kwargs: Any) -> Any:
        path = Path(args[path_at])
        if not when(path.name):
            return real(*args, **kwargs)
        path.write_bytes(b"\x00" * 64)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return full


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def one_line(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("nnatlas cache: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_a_full_disk_mid_shard(saved: Path, data: Path, whole: Path, tmp_path: Path,  # noqa: F811
                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import safetensors.torch

    out = tmp_path / "out"
    count = {"n": 0}

    def second(name: str) -> bool:
        count["n"] += 1
        return count["n"] == 2

    with monkeypatch.context() as m:
        m.setattr(safetensors.torch, "save_file", no_space(safetensors.torch.save_file, second, 1))
        assert run(cache(saved, data, out, *ARGV)) == 2
    one_line(capsys, "No space left on device", "shard-000-00001.safetensors", "--resume")
    assert leftovers(out) == []  # no temporary file, no lock
    assert run(cache(saved, data, out, *ARGV, "--resume")) == 0
    assert files(out) == files(whole)


@pytest.mark.parametrize("name", [".run.json.", ".journal-000.json.", ".manifest.json."])
def test_a_full_disk_writing_json(saved: Path, data: Path, whole: Path, tmp_path: Path, name: str,  # noqa: F811
                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", no_space(Path.write_text, lambda n: n.startswith(name), 0))
        assert run(cache(saved, data, out, *ARGV)) == 2
    one_line(capsys, "No space left on device", name.strip(".").removesuffix("."))
    assert leftovers(out) == []
    again = ["--resume"] if name != ".run.json." else []  # (no run.json: a new run, in the same folder)
    assert run(cache(saved, data, out, *ARGV, *again)) == 0
    assert files(out) == files(whole)


def read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Writes under ``folder`` fail as on a read-only mount (we run as root, where chmod stops nothing)."""
    def inside(path: Any) -> bool:
        return isinstance(path, (str, os.PathLike)) and Path(path).absolute().is_relative_to(folder)

    def refuse(path: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    mkdir, os_open, io_open = os.mkdir, os.open, io.open
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: refuse(p) if inside(p) else mkdir(p, *a, **k))
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT
    monkeypatch.setattr(os, "open", lambda p, flags, *a, **k: refuse(p) if inside(p) and flags & writes
                        else os_open(p, flags, *a, **k))
    monkeypatch.setattr(io, "open", lambda p, mode="r", *a, **k: refuse(p) if inside(p) and set(mode) & set("wax+")
                        else io_open(p, mode, *a, **k))


def test_a_read_only_out_is_one_line(saved: Path, data: Path, tmp_path: Path,  # noqa: F811
                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "empty").mkdir()
    with monkeypatch.context() as m:
        read_only(m, ro)
        assert run(cache(saved, data, ro / "new", *ARGV)) == 2  # a new folder in a read-only one
        one_line(capsys, "cannot create it", "Read-only file system")
        assert run(cache(saved, data, ro / "empty", *ARGV)) == 2  # an empty folder, read-only
        one_line(capsys, "cannot write there", "Read-only file system")
    assert sorted(p.name for p in ro.rglob("*")) == ["empty"]
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert run(cache(saved, data, a_file / "out", *ARGV)) == 2  # a path under a file
    one_line(capsys, "cannot create it", "Not a directory")


def test_resume_with_relative_paths(saved: Path, data: Path, whole: Path, tmp_path: Path,  # noqa: F811
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    shutil.copytree(whole, out)
    monkeypatch.chdir(tmp_path)
    rel = [os.path.relpath(p, tmp_path) for p in (saved, data, out)]
    assert run([rel[0], "--data", rel[1], "--out", rel[2], "--no-progress", *ARGV, "--resume"]) == 0
    assert files(out) == files(whole)


def test_resume_refuses_a_run_of_the_older_format(saved: Path, data: Path, whole: Path, tmp_path: Path,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(whole, out)
    settings = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**settings, "format": "nnatlas-cache/1"}))
    assert run(cache(saved, data, out, *ARGV, "--resume")) == 2
    one_line(capsys, "format 'nnatlas-cache/1' (an older nnatlas)", "start it again in an empty folder")


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_follow_the_umask(saved: Path, data: Path, tmp_path: Path, umask: int) -> None:  # noqa: F811
    out = tmp_path / "out"
    before = os.umask(umask)
    try:
        assert run(cache(saved, data, out, *ARGV, "--max-tokens", "30")) == 0
    finally:
        os.umask(before)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


# ---- feeding a trainer ---------------------------------------------------------------------------------

def rows_of(items: list[dict[str, torch.Tensor]]) -> list[int]:
    return [int(i["row"]) for i in items]


def test_dataset_rows_shuffled_by_seed(whole: Path) -> None:
    stored = nnatlas.Cache.load(whole)
    value = stored.values[0]
    ds = stored.dataset(value, shuffle=True, seed=7)
    items = list(ds)
    order = rows_of(items)
    assert sorted(order) == list(range(stored.rows)) and order != sorted(order) and len(ds) == stored.rows
    assert rows_of(list(stored.dataset(value, shuffle=True, seed=7))) == order  # deterministic
    assert rows_of(list(stored.dataset(value, shuffle=True, seed=8))) != order
    ds.set_epoch(1)
    assert sorted(rows_of(list(ds))) == sorted(order) and rows_of(list(ds)) != order
    per_shard = stored.manifest["rows_per_shard"]  # shards shuffled, then rows: a shard's rows come together
    shards = [r // per_shard for r in order]
    assert sum(a != b for a, b in zip(shards, shards[1:])) == len(stored.manifest["shards"]) - 1
    whole_value, doc, pos, tok = (stored[k] for k in (value, "meta.doc", "meta.position", "meta.token"))
    for item in items:
        r = int(item["row"])
        assert set(item) == {value, "doc", "position", "attention_mask", "token", "row"}
        assert torch.equal(item[value], whole_value[r])
        assert (item["doc"], item["position"], item["token"], item["attention_mask"]) == (doc[r], pos[r], tok[r], 1)
    assert rows_of(list(stored.dataset(value))) == list(range(stored.rows))  # (no shuffle: run order)


def test_dataset_with_dataloader_workers(whole: Path) -> None:
    stored = nnatlas.Cache.load(whole)
    ds = stored.dataset(shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2)
    batches = list(loader)
    rows = torch.cat([b["row"] for b in batches]).tolist()
    assert sorted(rows) == list(range(stored.rows))  # every row once: no duplicates, none lost
    logits = torch.cat([b["logits"] for b in batches])
    assert torch.equal(logits, stored["logits"][rows])


def test_dataset_in_batches(whole: Path) -> None:
    """batch_size: the same rows in the same order, a batch an item (each shard's last one smaller)."""
    stored = nnatlas.Cache.load(whole)
    rows = rows_of(list(stored.dataset(shuffle=True, seed=5)))
    ds = stored.dataset(shuffle=True, seed=5, batch_size=16)
    batches = list(ds)
    assert len(batches) == len(ds) and max(b["row"].shape[0] for b in batches) == 16
    assert torch.cat([b["row"] for b in batches]).tolist() == rows
    assert torch.equal(torch.cat([b["logits"] for b in batches]), stored["logits"][rows])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert sorted(torch.cat([b["row"] for b in loader]).tolist()) == list(range(stored.rows))
    with pytest.raises(ValueError, match="batch_size=0"):
        stored.dataset(batch_size=0)


def test_dataset_of_all_positions(saved: Path, data: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "all"
    assert run(cache(saved, data, out, "--layers", "1", "--positions", "all", "--seq-len", "6",
                     "--max-tokens", "40")) == 0
    stored = nnatlas.Cache.load(out)
    items = list(stored.dataset(shuffle=True, seed=0))
    assert sorted(rows_of(items)) == list(range(stored.rows))
    length = stored["meta.length"]
    for item in items:
        n = int(length[int(item["row"])])
        assert item["attention_mask"].tolist() == [1] * n + [0] * (6 - n)
        assert item["position"].tolist() == list(range(6)) and item["layers[1].layer_output"].shape[0] == 6


def test_a_rank_clears_only_its_own_temporary_files(tmp_path: Path) -> None:
    """What made two gloo processes fail under load: rank 0, clearing what a killed run left, read
    '-000' in rank 1's shard '.shard-001-00000' and removed the file rank 1 was writing."""
    from nnatlas.cache.store import remove_temporary

    names = {0: [".shard-000-00000.safetensors.tmp", ".shard-000-00012.safetensors.tmp", ".journal-000.json.7.tmp"],
             1: [".shard-001-00000.safetensors.tmp", ".shard-001-00010.safetensors.tmp", ".journal-001.json.7.tmp"],
             10: [".shard-010-00000.safetensors.tmp", ".journal-010.json.7.tmp"]}
    whole_run = [".run.json.7.tmp", ".manifest.json.7.tmp", "shard-001-00000.safetensors", "notes.txt"]
    for name in [*whole_run, *(n for ns in names.values() for n in ns)]:
        (tmp_path / name).write_bytes(b"x")
    cleared: set[str] = set()
    for rank in (1, 0, 10):
        remove_temporary(tmp_path, rank)
        cleared |= set(names[rank])
        every = set(whole_run) | {n for ns in names.values() for n in ns}
        assert {p.name for p in tmp_path.iterdir()} == every - cleared, rank
    remove_temporary(tmp_path)  # a new run: every temporary file, never a shard or another file
    assert {p.name for p in tmp_path.iterdir()} == {"shard-001-00000.safetensors", "notes.txt"}
