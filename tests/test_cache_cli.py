"""``nnatlas cache`` over a dataset: shards and a manifest whose rows equal direct traces; resuming a
stopped run gives the bytes of one never stopped; torchrun's ranks give the rows of one process;
bad input is one line and exit status 2, before any forward."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import nnatlas
from nnatlas.cache.store import ShardWriter, StoredCache
from nnatlas.cli import cache as cache_cli
from nnatlas.testing import WORDS, build

DOCS = 24


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama saved with save_pretrained, and its in-memory word-level tokenizer saved beside it."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = build("llama", attn_implementation="sdpa")
    model.native.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


def texts(n: int = DOCS, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) for _ in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts())))
    return path


@pytest.fixture(scope="module")
def model(saved: Path) -> nnatlas.AtlasModel:
    return nnatlas.load(str(saved))


def cache(saved: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [str(saved), "--data", str(data), "--out", str(out), "--no-progress", *extra]


def run(argv: list[str]) -> int:
    return cache_cli.main(argv)


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def direct(model: nnatlas.AtlasModel, text: str, seq_len: int, labels: list[str]) -> dict[str, torch.Tensor]:
    """Each value of one document traced alone: [seq, ...]."""
    ids = model.tokenizer(text, truncation=True, max_length=seq_len, return_tensors="pt")
    with model.trace(dict(ids), order="any"):
        saved = {label: _handle(model, label).save() for label in labels}
    return {k: v[0] for k, v in saved.items()}


def _handle(model: nnatlas.AtlasModel, label: str) -> object:
    node: object = model
    for part in label.split("."):
        name, _, idx = part.partition("[")
        node = getattr(node, name)
        if idx:
            node = node[int(idx.rstrip("]"))]  # type: ignore[index]
    return node


def test_rows_equal_direct_traces(saved: Path, data: Path, model: nnatlas.AtlasModel, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(cache(saved, data, out, "--values", "layer_output,self_attn.attention_output", "--values", "logits",
                     "--layers", "0-1", "--batch-size", "5", "--seq-len", "10", "--shard-size", "0.01")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    labels = ["layers[0].layer_output", "layers[1].layer_output", "layers[0].self_attn.attention_output",
              "layers[1].self_attn.attention_output", "logits"]
    assert manifest["values"] == labels
    assert manifest["family"] == "llama" and manifest["positions"] == "nonpad" and manifest["world_size"] == 1
    assert manifest["layouts"]["logits"]["row_dims"] == ["rows", "vocab_size"]
    assert manifest["layouts"]["layers[0].layer_output"]["row_shape"] == [model.hidden_size]
    ids = [model.tokenizer(t, truncation=True, max_length=10)["input_ids"] for t in texts()]
    assert manifest["tokens"] == manifest["rows"] == sum(len(i) for i in ids)
    assert manifest["docs"] == DOCS
    # shards: at most --shard-size each, contiguous rows covering the run
    assert len(manifest["shards"]) > 2
    ends = [s["rows"] for s in manifest["shards"]]
    assert ends[0][0] == 0 and ends[-1][1] == manifest["rows"]
    assert all(a[1] == b[0] for a, b in zip(ends, ends[1:]))
    assert all((out / s["file"]).stat().st_size <= 0.01e6 for s in manifest["shards"])

    stored = nnatlas.Cache.load(out)
    assert stored.values == labels and len(stored) == manifest["rows"]
    assert stored.layout("layers[1].layer_output").dims == ("rows", "hidden_size")
    doc, pos = stored["meta.doc"], stored["meta.position"]
    for label in labels:
        whole = stored[label]
        assert whole.shape == (manifest["rows"], *manifest["layouts"][label]["row_shape"])
        batches = list(stored.batches(label, 7))
        assert [b.shape[0] for b in batches[:-1]] == [7] * (len(batches) - 1)
        assert torch.equal(torch.cat(batches), whole)
        assert torch.equal(torch.cat(list(stored.batches(label, 5, start=3, stop=40))), whole[3:40])
    with pytest.raises(KeyError, match="per-row facts: meta.doc, meta.position, meta.token"):
        stored.layout("layers[2].layer_output")
    for i, text in enumerate(texts()):
        rows = doc == i
        assert pos[rows].tolist() == list(range(len(ids[i])))
        alone = direct(model, text, 10, labels)
        for label in labels:
            torch.testing.assert_close(stored[label][rows], alone[label], atol=1e-5, rtol=1e-4)
    # rows in length order (longest document first, ties in file order): each row's meta.doc says whose
    assert manifest["order"] == "length"
    order = sorted(range(DOCS), key=lambda i: -len(ids[i]))
    assert torch.equal(stored["meta.token"], torch.tensor([t for i in order for t in ids[i]]))


@pytest.mark.parametrize("family", ["gpt2", "qwen3_5_text", "qwen3_next"])
def test_rows_equal_direct_traces_in_other_families(family: str, data: Path, tmp_path: Path) -> None:
    """Right padding keeps every real token's values: absolute positions (gpt2), DeltaNet blocks and a
    mixture of experts; a value of the attention blocks only is read on those."""
    folder = tmp_path / family
    built = build(family, attn_implementation="sdpa")
    built.native.save_pretrained(folder)
    built.tokenizer.save_pretrained(folder)
    out = tmp_path / "out"
    last = len(built.layers) - 1
    assert run(cache(folder, data, out, "--values", "layer_output,self_attn.attention_output", "--layers",
                     f"0,{last}", "--batch-size", "6", "--seq-len", "10")) == 0
    stored = nnatlas.Cache.load(out)
    model = nnatlas.load(str(folder))
    attention = [i for i in (0, last) if model.layer_kinds[i] in (None, "attention")]
    assert attention and stored.values == [*(f"layers[{i}].layer_output" for i in (0, last)),
                                           *(f"layers[{i}].self_attn.attention_output" for i in attention)]
    doc = stored["meta.doc"]
    for i, text in enumerate(texts()):
        alone = direct(model, text, 10, stored.values)
        for label in stored.values:
            torch.testing.assert_close(stored[label][doc == i], alone[label], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("positions", ["last", "all"])
def test_last_and_all_positions(saved: Path, data: Path, model: nnatlas.AtlasModel, tmp_path: Path,
                                positions: str) -> None:
    out = tmp_path / positions
    assert run(cache(saved, data, out, "--layers", "2", "--positions", positions, "--batch-size", "4",
                     "--seq-len", "8", "--dtype", "bfloat16", "--max-tokens", "60")) == 0
    stored = nnatlas.Cache.load(out)
    value = stored["layers[2].layer_output"]
    assert value.dtype == torch.bfloat16
    docs = stored["meta.doc"].tolist()
    ids = [model.tokenizer(t, truncation=True, max_length=8)["input_ids"] for t in texts()]
    lengths: list[int] = []
    for i in range(len(docs)):  # --max-tokens 60: documents in file order, the last one cut to make 60 tokens
        lengths.append(min(len(ids[i]), 60 - sum(lengths)))
    assert sum(lengths) == stored.manifest["tokens"] == 60
    # `last` batches the longest documents first (ties in file order); `all` pads every batch to --seq-len,
    # so nothing is gained by sorting: file order
    want = sorted(range(len(docs)), key=lambda i: -lengths[i]) if positions == "last" else list(range(len(docs)))
    assert docs == want and stored.manifest["order"] == ("length" if positions == "last" else "file")
    for row, i in enumerate(docs):
        n = lengths[i]
        alone = direct(model, texts()[i], 8, ["layers[2].layer_output"])["layers[2].layer_output"][:n]
        if positions == "last":
            torch.testing.assert_close(value[row], alone[n - 1].to(torch.bfloat16))
        else:
            assert value.shape[1:] == (8, model.hidden_size)
            assert stored["meta.length"][row] == n
            torch.testing.assert_close(value[row, :n], alone.to(torch.bfloat16))


class Stop(Exception):
    """The injected failure: the process dies here."""


def test_a_stopped_run_resumed_equals_one_never_stopped(saved: Path, data: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--layers", "0,2", "--batch-size", "3", "--seq-len", "12", "--shard-size", "0.005"]
    whole = tmp_path / "whole"
    assert run(cache(saved, data, whole, *argv)) == 0
    shards = [p for p in whole.iterdir() if p.name.startswith("shard-")]
    assert len(shards) >= 4
    write = ShardWriter.write
    for stop_at, torn in ((2, False), (3, True)):  # stopped between shards; stopped inside a shard's write
        out = tmp_path / f"stopped-{stop_at}"
        count = {"n": 0}

        def dying(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str],
                  stop_at: int = stop_at, torn: bool = torn, count: dict[str, int] = count) -> None:
            if count["n"] == stop_at:
                if torn:  # half a file under the temporary name, as a killed write leaves it
                    path.with_name(f".{path.name}.tmp").write_bytes(b"\x00" * 100)
                raise Stop
            count["n"] += 1
            write(path, tensors, metadata)

        monkeypatch.setattr(ShardWriter, "write", staticmethod(dying))
        with pytest.raises(Stop):
            run(cache(saved, data, out, *argv))
        monkeypatch.setattr(ShardWriter, "write", staticmethod(write))
        assert not _writer_threads()  # the error on the writer thread stopped it, and was raised here
        assert sum(p.name.startswith("shard-") for p in out.iterdir()) == stop_at
        assert not (out / "manifest.json").exists()
        with pytest.raises(Exception, match="did not finish"):
            nnatlas.Cache.load(out)
        assert run(cache(saved, data, out, *argv, "--resume")) == 0
        got = files(out)
        want = files(whole)
        got["manifest.json"] = got["manifest.json"].replace(str(out).encode(), str(whole).encode())
        got["run.json"] = got["run.json"].replace(str(out).encode(), str(whole).encode())
        assert got == want  # every shard byte for byte, the manifest, and nothing else
    # resuming a finished run writes the same again
    assert run(cache(saved, data, whole, *argv, "--resume")) == 0
    assert files(whole) == want


def test_a_killed_process_resumed_equals_one_never_killed(saved: Path, tmp_path: Path) -> None:
    """SIGKILL once the first shard is on disk (no chance to clean up), then --resume."""
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(1500, seed=1)))
    argv = ["--layers", "1", "--batch-size", "8", "--seq-len", "12", "--shard-size", "0.02"]
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "nnatlas", "cache", *cache(saved, big, out, *argv)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out / "shard-000-00000.safetensors").exists() and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.kill()
    finally:
        proc.wait()
    assert not (out / "manifest.json").exists(), "the run finished before it was killed"
    assert (out / ".lock").read_text().strip() == str(proc.pid)  # its lock file stays; the kernel freed the lock
    whole = tmp_path / "whole"
    assert run(cache(saved, big, whole, *argv)) == 0
    shards = len(json.loads((whole / "manifest.json").read_text())["shards"])
    assert 0 < sum(p.name.startswith("shard-") for p in out.iterdir()) < shards
    assert run(cache(saved, big, out, *argv, "--resume")) == 0
    assert files(out) == files(whole)
    nnatlas.Cache.load(out, verify="content")  # every shard's sha256 as the manifest records it


def test_resume_refuses_other_settings_and_a_missing_run(saved: Path, data: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(cache(saved, data, out, "--layers", "0", "--seq-len", "6")) == 0
    capsys.readouterr()
    assert run(cache(saved, data, out, "--layers", "0", "--seq-len", "7", "--resume")) == 2
    err = capsys.readouterr().err
    assert "seq_len: 6 then, 7 now" in err and err.count("\n") == 1
    assert run(cache(saved, data, out, "--layers", "0", "--seq-len", "6")) == 2
    assert "is not an empty folder (a run is there: pass --resume to continue it)" in capsys.readouterr().err
    assert run(cache(saved, data, tmp_path / "none", "--resume")) == 2
    assert "holds no run to continue" in capsys.readouterr().err


def test_txt_and_parquet(saved: Path, data: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the optional `parquet` extra (in `test`)")
    import pyarrow as pa

    txt = tmp_path / "corpus.txt"
    txt.write_text("\n".join(texts()) + "\n\n")
    par = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"body": texts(), "n": list(range(DOCS))}), par)
    outs = {}
    for name, path, field in (("jsonl", data, "text"), ("txt", txt, "text"), ("parquet", par, "body")):
        outs[name] = tmp_path / name
        assert run(cache(saved, path, outs[name], "--layers", "1", "--text-field", field)) == 0
    # the same rows (the shards' bytes differ in the run id only: another data file is another run)
    stored = {name: nnatlas.Cache.load(out) for name, out in outs.items()}
    for key in ("layers[1].layer_output", "meta.doc", "meta.position", "meta.token"):
        assert torch.equal(stored["jsonl"][key], stored["txt"][key]) and torch.equal(stored["txt"][key],
                                                                                     stored["parquet"][key])


def bad(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], data: Path, *extra: str) -> str:
    out = tmp_path / "never"
    assert run(cache(saved, data, out, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("nnatlas cache: error: ") and err.count("\n") == 1, err
    assert not out.exists()  # refused before the out folder, before any forward
    return err


def test_bad_input_is_one_line_and_exit_2(saved: Path, data: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert "has no field 'body' (its fields: id, text); name the text with --text-field" in bad(
        saved, tmp_path, capsys, data, "--text-field", "body")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert "holds no documents" in bad(saved, tmp_path, capsys, empty)
    assert "no such file" in bad(saved, tmp_path, capsys, tmp_path / "nothing.jsonl")
    csv = tmp_path / "corpus.csv"
    csv.write_text("a\n")
    assert "not a .jsonl, .txt, .parquet file" in bad(saved, tmp_path, capsys, csv)
    # values this load cannot serve: refused before any forward
    forwards = []
    monkeypatch.setattr(torch.nn.Module, "__call__", _counting(torch.nn.Module.__call__, forwards))
    # (under sdpa the pattern is served, recomputed: what refuses it is its layout, not per token)
    assert "nnatlas cache stores values per token" in bad(saved, tmp_path, capsys, data, "--values",
                                                           "self_attn.attention_probabilities")
    assert "nearest:" in bad(saved, tmp_path, capsys, data, "--values", "layer_outptu")
    assert "stores values per token" in bad(saved, tmp_path, capsys, data, "--values", "input_size")
    assert "layers[0] to layers[2]" in bad(saved, tmp_path, capsys, data, "--layers", "1-5")
    assert "--layers 'x': write block indices" in bad(saved, tmp_path, capsys, data, "--layers", "x")
    assert "--batch-size is at least 1" in bad(saved, tmp_path, capsys, data, "--batch-size", "0")
    if not torch.cuda.is_available():
        assert "this torch has no CUDA device" in bad(saved, tmp_path, capsys, data, "--device", "cuda")
    assert not [m for m in forwards if "ForCausalLM" in m]
    assert run(cache(saved, data, tmp_path / "good", "--layers", "0")) == 0  # (the count sees a forward)
    assert [m for m in forwards if "ForCausalLM" in m]
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    par = tmp_path / "corpus.parquet"
    par.write_bytes(b"PAR1")
    assert "reading Parquet needs pyarrow, which is not installed" in bad(saved, tmp_path, capsys, par)


def _counting(call: object, seen: list[str]) -> object:
    def counted(self: torch.nn.Module, *args: object, **kwargs: object) -> object:
        seen.append(type(self).__name__)
        return call(self, *args, **kwargs)  # type: ignore[operator]
    return counted


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def test_the_console_script_and_python_m(saved: Path, data: Path, tmp_path: Path) -> None:
    """``nnatlas cache`` (the console script) and ``python -m nnatlas cache`` (what torchrun runs) reach the
    command: one writes the shards an in-process run writes, the other says a bad field in one line."""
    script = Path(sys.executable).with_name("nnatlas")
    out, here = tmp_path / "script", tmp_path / "here"
    done = subprocess.run([str(script), "cache", *cache(saved, data, out, "--layers", "1")], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "tokens/s" in done.stderr
    assert run(cache(saved, data, here, "--layers", "1")) == 0
    assert files(out) == files(here)
    done = subprocess.run([sys.executable, "-m", "nnatlas", "cache",
                           *cache(saved, data, tmp_path / "x", "--text-field", "body")],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("nnatlas cache: error: ") and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.torchrun
def test_two_gloo_processes_give_the_rows_of_one(saved: Path, data: Path, tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    argv = ["--values", "layer_output,mlp.mlp_output", "--layers", "0-2", "--batch-size", "4", "--seq-len", "12",
            "--shard-size", "0.01"]
    one = tmp_path / "one"
    assert run(cache(saved, data, one, *argv)) == 0
    two = tmp_path / "two"
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "nnatlas", "cache",
                           *cache(saved, data, two, *argv)], env=_env(), capture_output=True, text=True, timeout=180)
    # (a failing rank's own words first: torchrun's report of the others comes after them)
    said = [line for line in done.stderr.splitlines() if "nnatlas cache: error" in line]
    assert done.returncode == 0, "\n".join([*said, done.stderr[-3000:]])
    a, b = nnatlas.Cache.load(one), nnatlas.Cache.load(two)
    assert b.manifest["world_size"] == 2 and {s["rank"] for s in b.manifest["shards"]} == {0, 1}
    assert (a.rows, a.manifest["tokens"], a.values) == (b.rows, b.manifest["tokens"], b.values)
    for key in ("meta.doc", "meta.position", "meta.token"):
        assert torch.equal(a[key], b[key])
    for label in a.values:  # the same batches on one process or two: the same rows, in the same order
        torch.testing.assert_close(a[label], b[label], atol=1e-6, rtol=1e-5)


def test_bad_bytes_numbers_devices_and_values_are_one_line_and_exit_2(
        saved: Path, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # bytes that are not UTF-8: where they are (file, line, byte of the line and of the file), or read as U+FFFD
    txt = tmp_path / "bad.txt"
    txt.write_bytes(b"one two\nthree \xff four\n")
    err = bad(saved, tmp_path, capsys, txt)
    assert f"{txt}:2: byte 0xff at byte 6 of the line (byte 14 of the file) is not UTF-8" in err
    assert "--errors replace" in err
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_bytes(b'{"text": "one"}\n{"text": "two \xc3("}\n')
    assert f"{jsonl}:2: byte 0xc3 at byte 14 of the line (byte 30 of the file) is not UTF-8" in bad(
        saved, tmp_path, capsys, jsonl)
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"text": "one \\ud800 two"}\n')
    assert f"{surrogate}:1: field 'text' holds a lone surrogate" in bad(saved, tmp_path, capsys, surrogate)
    for path in (txt, jsonl, surrogate):
        out = tmp_path / f"replaced-{path.name}"
        assert run(cache(saved, path, out, "--layers", "0", "--errors", "replace")) == 0
        assert nnatlas.Cache.load(out).manifest["docs"] == (1 if path is surrogate else 2)
    capsys.readouterr()
    # numbers that are not finite, or absurd, or that hold not one row
    for shard, said in (("inf", "inf"), ("nan", "nan"), ("-inf", "-inf"), ("1e300", "1e+300")):
        assert f"--shard-size {said}: a number of MB above 0" in bad(saved, tmp_path, capsys, data,
                                                                     f"--shard-size={shard}")
    assert "--seq-len 99999999: at most 1048576" in bad(saved, tmp_path, capsys, data, "--seq-len", "99999999")
    assert "--batch-size 99999999: at most 1048576" in bad(saved, tmp_path, capsys, data, "--batch-size", "99999999")
    assert "--shard-size 1e-06 holds not one row" in bad(saved, tmp_path, capsys, data, "--shard-size", "0.000001")
    # devices this torch has not, or that hold no values
    assert "--device 'tpu:9' is not a device" in bad(saved, tmp_path, capsys, data, "--device", "tpu:9")
    assert "--device meta computes shapes, not values" in bad(saved, tmp_path, capsys, data, "--device", "meta")
    if torch.cuda.is_available():
        assert f"this machine has {torch.cuda.device_count()} CUDA device" in bad(
            saved, tmp_path, capsys, data, "--device", f"cuda:{torch.cuda.device_count()}")
    # a list of no values
    for values in (",", " , "):
        assert "names no value" in bad(saved, tmp_path, capsys, data, "--values", values)


class Recording:
    """A tokenizer that remembers the longest text it was handed."""

    def __init__(self, tokenizer: object):
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, texts: str | list[str], **kwargs: object) -> dict[str, list[list[int]]]:
        self.longest = max(self.longest, *(len(t) for t in ([texts] if isinstance(texts, str) else texts)))
        return self.tokenizer(texts, **kwargs)  # type: ignore[operator,no-any-return]


def test_a_long_line_is_tokenized_in_pieces_of_about_seq_len(model: nnatlas.AtlasModel) -> None:
    """A 1 MB line is handed to the tokenizer in prefixes of a few hundred characters (in proportion to
    --seq-len, not to the line), and gives the tokens of the whole line; one word of 1.5 MB (no prefix holds
    enough tokens) stops growing at MOST characters per token."""
    from nnatlas.cache.data import MARGIN, MOST, tokenize

    rng = random.Random(2)
    line = " ".join(rng.choice(WORDS) for _ in range(250_000))
    assert len(line) > 1_000_000
    short = texts(3)
    rec = Recording(model.tokenizer)
    got = tokenize(rec, [short[0], line, short[1], "x" * 1_500_000, short[2]], 16)
    assert rec.longest <= MOST * (16 + MARGIN) < 30_000
    whole = model.tokenizer([short[0], line, short[1], short[2]], truncation=True, max_length=16)["input_ids"]
    assert [got[0], got[1], got[2], got[4]] == [list(i) for i in whole]
    assert 0 < len(got[3]) <= 16


def test_plan_batches_by_length_and_splits_ranks_by_cost() -> None:
    """Longest documents first (ties in file order), cut into batches; ranks take contiguous runs of about
    the same cost, in the order of one process; --no-sort (order="file") keeps the file's order."""
    from nnatlas.cache.data import plan

    rng = random.Random(3)
    lengths = [rng.randint(1, 60) for _ in range(400)]
    ids = [[7] * n for n in lengths]
    one = plan(ids, 8, "nonpad", 1, order="length")
    docs = [d for b in one.ranks[0] for d in b.docs]
    assert [d.index for d in docs] == sorted(range(400), key=lambda i: -lengths[i])
    assert one.order == "length" and one.tokens == sum(lengths)
    by_file = plan(ids, 8, "nonpad", 1, order="file")
    assert [d.index for b in by_file.ranks[0] for d in b.docs] == list(range(400))
    assert one.padded(0) < 1.02 * one.tokens < by_file.padded(0)
    for world in (2, 3, 7):
        many = plan(ids, 8, "nonpad", world, order="length")
        assert [b.docs for r in many.ranks for b in r] == [b.docs for b in one.ranks[0]]
        costs = [many.padded(r) for r in range(world)]
        biggest = max(len(b.docs) * len(b.docs[0].ids) for b in one.ranks[0])
        assert max(costs) - min(costs) <= 2 * biggest, costs
        assert all(b.first_row == sum(x.rows for x in r[:k]) for r in many.ranks for k, b in enumerate(r))


def test_no_sort_keeps_file_order_and_both_report_padding(saved: Path, data: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--layers", "1", "--batch-size", "6", "--seq-len", "10"]
    sorted_out, file_out = tmp_path / "sorted", tmp_path / "file"
    assert run(cache(saved, data, sorted_out, *argv)) == 0
    said_sorted = capsys.readouterr().err
    assert run(cache(saved, data, file_out, *argv, "--no-sort")) == 0
    said_file = capsys.readouterr().err
    a, b = nnatlas.Cache.load(sorted_out), nnatlas.Cache.load(file_out)
    assert (a.manifest["order"], b.manifest["order"]) == ("length", "file")
    assert b["meta.doc"].tolist() == sorted(b["meta.doc"].tolist())
    assert a["meta.doc"].tolist() != b["meta.doc"].tolist()
    assert a.manifest["padded_tokens"] < b.manifest["padded_tokens"]
    for said, m in ((said_sorted, a.manifest), (said_file, b.manifest)):
        padding = 100 * (1 - m["tokens"] / m["padded_tokens"])
        assert f"padding {padding:.1f}% of the positions the forwards ran" in said
    # the same rows, found by document and position
    rows_a, rows_b = _by_doc_and_position(a), _by_doc_and_position(b)
    assert rows_a.keys() == rows_b.keys()
    for k, v in rows_a.items():
        torch.testing.assert_close(v, rows_b[k], atol=1e-5, rtol=1e-4)


def _by_doc_and_position(stored: StoredCache) -> dict[tuple[int, int], torch.Tensor]:
    where = zip(stored["meta.doc"].tolist(), stored["meta.position"].tolist())
    return dict(zip(where, stored["layers[1].layer_output"]))


def _writer_threads() -> list[object]:
    import threading

    return [t for t in threading.enumerate() if t.name == "nnatlas-cache-writer"]


def test_shard_writes_overlap_the_forwards(saved: Path, data: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """While the first shard is written, the next batches' forwards run (on main they waited for it)."""
    forwards: list[int] = []
    batch_rows = cache_cli.batch_rows

    def counting(*args: object, **kwargs: object) -> object:
        forwards.append(1)
        return batch_rows(*args, **kwargs)  # type: ignore[arg-type]

    write = ShardWriter.write
    during: list[int] = []

    def slow(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        if not during:  # the first shard: wait (5 s at most) for two more forwards
            n = len(forwards)
            deadline = time.monotonic() + 5
            while len(forwards) < n + 2 and time.monotonic() < deadline:
                time.sleep(0.002)
            during.append(len(forwards) - n)
        write(path, tensors, metadata)

    monkeypatch.setattr(cache_cli, "batch_rows", counting)
    monkeypatch.setattr(ShardWriter, "write", staticmethod(slow))
    out = tmp_path / "out"
    assert run(cache(saved, data, out, "--layers", "0", "--batch-size", "1", "--seq-len", "10",
                     "--shard-size", "0.01")) == 0
    assert during and during[0] >= 2, during
    assert len(nnatlas.Cache.load(out).manifest["shards"]) > 1
    assert not _writer_threads()


def test_an_interrupt_stops_the_writer_thread_and_resumes(saved: Path, data: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the forward loop: the writer thread stops (no thread left, no torn file) and --resume
    gives the bytes of a run never stopped."""
    argv = ["--layers", "0,2", "--batch-size", "2", "--seq-len", "12", "--shard-size", "0.005"]
    whole = tmp_path / "whole"
    assert run(cache(saved, data, whole, *argv)) == 0
    batch_rows = cache_cli.batch_rows
    calls: list[int] = []

    def interrupted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 8:  # (the first call is the one-token probe of the row shapes)
            raise KeyboardInterrupt
        return batch_rows(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cache_cli, "batch_rows", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run(cache(saved, data, out, *argv))
    assert not _writer_threads()
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.endswith(".tmp")] and "manifest.json" not in names
    assert 0 < sum(n.startswith("shard-") for n in names) < len(json.loads((whole / "manifest.json").read_text())["shards"])
    monkeypatch.setattr(cache_cli, "batch_rows", batch_rows)
    assert run(cache(saved, data, out, *argv, "--resume")) == 0
    got = files(out)
    got["manifest.json"] = got["manifest.json"].replace(str(out).encode(), str(whole).encode())
    got["run.json"] = got["run.json"].replace(str(out).encode(), str(whole).encode())
    assert got == files(whole)
