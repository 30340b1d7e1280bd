"""The adversary's matrix on the draft cache (``load(path, draft=True)``'s kept drafts) and on a user's spec.

One tiny Helium (a type nnatlas ships no family for) is drafted once for the module, and its kept file taken as the
genuine one; each case plants a tampered file (or folder) in a fresh cache, loads again, and asserts: no code runs
(the planted code would write a marker file), the values served are transformers' own, and one warning line says
what was refused. The draft made again after a refusal is the module's genuine draft (its drafting counted), so a
case costs one compile and one verification, not one draft.
"""

from __future__ import annotations

import json
import os
import re
import stat
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import nnatlas
from nnatlas import registry, safe_files
from nnatlas.compiler import userspec
from nnatlas.loading import draft_cache, user_specs

IDS = torch.tensor([[2, 5, 9, 4, 7, 11], [2, 8, 6, 3, 10, 12]])
SAID = (draft_cache.DraftCacheWarning, safe_files.UnsafeFolderWarning)


def _helium() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.HeliumConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=64, head_dim=8)
    return transformers.HeliumForCausalLM(config).eval()


def _forget() -> None:
    for name in list(registry._LAST):
        registry.remove_user(name)
    user_specs._COMPILED.clear()
    user_specs._ORIGINS.clear()


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The genuine kept draft of the tiny Helium: its file name, bytes, data, and what draft_verified returned."""
    cache = tmp_path_factory.mktemp("genuine")
    made: list[Any] = []
    real = userspec.draft_verified
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NNATLAS_CACHE", str(cache))
        mp.setattr(userspec, "draft_verified", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
        nnatlas.wrap(_helium(), draft=True)
    (path,) = (cache / "drafts").glob("*.json")
    _forget()
    yield {"name": path.name, "raw": path.read_bytes(), "data": json.loads(path.read_bytes()), "verified": made[0],
           "mode": (stat.S_IMODE((cache / "drafts").stat().st_mode), stat.S_IMODE(path.stat().st_mode))}
    _forget()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, genuine: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A fresh cache folder (0700) for one case; ``drafts`` counts the drafts made (each the genuine one)."""
    folder = tmp_path / "cache" / "drafts"
    safe_files.make_private_dir(folder)
    monkeypatch.setenv("NNATLAS_CACHE", str(tmp_path / "cache"))
    counted: list[int] = []

    def again(*a: Any, **k: Any) -> Any:
        counted.append(1)
        registry.add_user(genuine["verified"].module)
        return genuine["verified"]

    monkeypatch.setattr(userspec, "draft_verified", again)
    _forget()
    yield {"folder": folder, "path": folder / genuine["name"], "drafts": counted, "marker": tmp_path / "PWNED"}
    _forget()


def _plant(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600)


def _kept(genuine: dict[str, Any], spec: Callable[[str], str] | None = None, **record: Any) -> bytes:
    data = json.loads(json.dumps(genuine["data"]))
    if spec is not None:
        data["spec"] = spec(data["spec"])
    data["record"].update(record)
    return json.dumps(data).encode()


def _load() -> tuple[nnatlas.AtlasModel, list[str]]:
    """wrap(draft=True) of the tiny Helium: the model and the lines said (warnings of the cache's kinds)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = nnatlas.wrap(_helium(), draft=True)
    said = [str(w.message) for w in caught if issubclass(w.category, SAID)]
    return model, said


def _serves_transformers(model: nnatlas.AtlasModel) -> None:
    ins, attn, mlp, outs = [], [], [], []
    with model.trace({"input_ids": IDS}):
        for i in range(model.num_layers):  # (in the forward's order)
            ins.append(model.layers[i].layer_input.save())
            attn.append(model.layers[i].self_attn.attention_output.save())
            mlp.append(model.layers[i].mlp.mlp_output.save())
            outs.append(model.layers[i].layer_output.save())
        logits = model.logits.save()
    with torch.no_grad():
        plain = model.native(input_ids=IDS, output_hidden_states=True)
    assert torch.equal(logits, plain.logits)
    for i in range(model.num_layers):
        assert torch.equal(ins[i], plain.hidden_states[i])
        torch.testing.assert_close(ins[i] + attn[i] + mlp[i], outs[i], rtol=0, atol=1e-6)
        if i < model.num_layers - 1:
            assert torch.equal(outs[i], plain.hidden_states[i + 1])


def _refused_once(cache: dict[str, Any], said: list[str], why: str) -> None:
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0] == f"the kept draft {cache['path']} is not used: {why}; helium is drafted again", said[0]
    assert cache["drafts"] == [1]


def test_the_genuine_draft_is_data_in_private_files(genuine: dict[str, Any]) -> None:
    assert set(genuine["data"]) == {"format", "family", "spec", "record"} and genuine["data"]["family"] == "helium"
    assert genuine["data"]["spec"] == genuine["verified"].text  # the drafted spec, as nnatlas draft writes it
    assert "def " not in genuine["raw"].decode() and "import " not in genuine["raw"].decode()
    rec = genuine["data"]["record"]
    assert rec["transformers"] == transformers.__version__ and rec["config_class"] == "HeliumConfig"
    assert "oracle logits [eager]" in rec["held"] and rec["refused"] == []
    assert genuine["mode"] == (0o700, 0o600)


def test_a_kept_draft_serves_compiled_and_checked_again(cache: dict[str, Any], genuine: dict[str, Any]) -> None:
    _plant(cache["path"], genuine["raw"])
    model, said = _load()
    assert said == [] and cache["drafts"] == []
    assert re.search(r"\(kept from an earlier load; its \d+ checks held again\)$", registry.origin(model._family))
    _serves_transformers(model)


def test_a_kept_spec_is_compiled_once_per_process(cache: dict[str, Any], genuine: dict[str, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile (about 0.5 s in a fresh process) is kept in memory by the spec's sha256: a second load of the same
    kept spec in this process (here: its family put out of the lookup and its draft's key forgotten) compiles nothing,
    and still checks it again."""
    _plant(cache["path"], genuine["raw"])
    first, _ = _load()
    registry.remove_user("helium")
    for key in [k for k in user_specs._COMPILED if k[0] == "draft"]:
        del user_specs._COMPILED[key]
    monkeypatch.setattr(userspec, "compile_text", lambda *a, **k: pytest.fail("compiled again"))
    ran: list[str] = []
    checks = userspec.checks
    monkeypatch.setattr(userspec, "checks", lambda name, *a: ran.append(name) or checks(name, *a))
    again, said = _load()
    assert said == [] and cache["drafts"] == [] and ran == ["helium"]
    assert type(again) is type(first)
    _serves_transformers(again)


CODE = "import os; open({marker!r}, 'w').write('ran')"


def test_code_in_the_spec_is_a_string_never_run(cache: dict[str, Any], genuine: dict[str, Any]) -> None:
    """Python planted where the spec holds text (the summary) stays text: it serves, says it, and runs nothing."""
    code = CODE.format(marker=str(cache["marker"]))
    _plant(cache["path"], _kept(genuine, lambda s: s.replace("summary: >\n", f"summary: >\n  {code}\n", 1)))
    model, said = _load()
    assert said == [] and cache["drafts"] == [] and not cache["marker"].exists()
    assert model._family.summary.startswith(code)
    _serves_transformers(model)


@pytest.mark.parametrize("where", ["a line of its own", "a read point", "the old format's adapter source"])
def test_code_injected_into_a_kept_draft_runs_nothing(where: str, cache: dict[str, Any],
                                                       genuine: dict[str, Any]) -> None:
    code = CODE.format(marker=str(cache["marker"]))
    if where == "a line of its own":
        raw = _kept(genuine, lambda s: s.replace("family: helium\n", f"family: helium\n{code}\n", 1))
        why = r"its spec does not compile \(<the spec kept in .*>:8:1: invalid YAML: could not find expected .:.\)"
    elif where == "a read point":
        raw = _kept(genuine, lambda s: s.replace('mlp_output: "output"', f'mlp_output: "{code}"', 1))
        why = r"its spec does not compile \(<the spec kept in .*>:\d+:\d+: .*\)"
    else:  # what the cache kept before: Python, which a load ran
        raw = json.dumps({"family": "helium", "origin": "x", "source": f"{code}\n"}).encode()
        why = re.escape("not a kept draft (its keys: ['family', 'origin', 'source'])")
    _plant(cache["path"], raw)
    model, said = _load()
    assert not cache["marker"].exists()
    assert len(said) == 1 and re.fullmatch(f"the kept draft {re.escape(str(cache['path']))} is not used: {why}; "
                                           "helium is drafted again", said[0]), said
    assert cache["drafts"] == [1]
    _serves_transformers(model)


def _flipped(raw: bytes) -> bytes:
    mid = len(raw) // 2
    return raw[:mid] + bytes(b ^ 0xFF for b in raw[mid:mid + 8]) + raw[mid + 8:]


CASES: dict[str, tuple[Callable[[dict[str, Any]], bytes], str]] = {
    "bytes flipped": (lambda g: _flipped(g["raw"]), "not UTF-8 text"),
    "truncated": (lambda g: g["raw"][: len(g["raw"]) // 2], "not JSON (Unterminated string starting at: line "),
    "another transformers": (lambda g: _kept(g, transformers="4.57.1"),
                             f"drafted under transformers 4.57.1, this is {transformers.__version__}"),
    "another config": (lambda g: _kept(g, config_sha256="0" * 64), "drafted for another config (sha256 000000000000…"),
    "another compiler": (lambda g: _kept(g, compiler_sha256="1" * 64),
                         "drafted by another drafter or compiler than this nnatlas's"),
    "a wrong read": (lambda g: _kept(g, lambda s: s.replace('attention_output: "output[0]"',
                                                            'attention_output: "o_proj.input"', 1)),
                     "its checks did not hold again (identity layers[i]: layer_input + self_attn.attention_output + "
                     "mlp.mlp_output == layer_output: "),
    "another tree": (lambda g: _kept(g, lambda s: s.replace('mlp_norm_output: "post_attention_layernorm.output"',
                                                            'mlp_norm_output: "post_mlp_layernorm.output"', 1)),
                     "its spec does not"),
    "a YAML bomb": (lambda g: _kept(g, lambda s: s.replace("title:", _BOMB + "\ntitle:", 1)),
                    "its spec does not compile (<the spec kept in "),
    "a JSON bomb": (lambda g: b"[" * 100_000 + b"]" * 100_000, "not JSON (nested too deep)"),
}
_BOMB = "\n".join(['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] +
                  [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)])


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_kept_draft_is_refused_in_one_line(case: str, cache: dict[str, Any],
                                                       genuine: dict[str, Any]) -> None:
    make, why = CASES[case]
    _plant(cache["path"], make(genuine))
    model, said = _load()
    assert len(said) == 1 and said[0].startswith(f"the kept draft {cache['path']} is not used: {why}"), said
    assert said[0].endswith("; helium is drafted again") and "\n" not in said[0]
    assert cache["drafts"] == [1]
    _serves_transformers(model)
    assert cache["path"].read_bytes() == genuine["raw"]  # (the refused file is replaced by the genuine draft)


def test_a_link_out_of_the_folder_is_not_followed(cache: dict[str, Any], genuine: dict[str, Any],
                                                   tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    _plant(elsewhere, _kept(genuine, lambda s: s.replace('attention_output: "output[0]"',
                                                          'attention_output: "o_proj.input"', 1)))
    cache["path"].symlink_to(elsewhere)
    model, said = _load()
    _refused_once(cache, said, f"a link (to {elsewhere}), not a file of the folder")
    _serves_transformers(model)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_of_another_user_is_not_read(cache: dict[str, Any], genuine: dict[str, Any]) -> None:
    _plant(cache["path"], genuine["raw"])
    os.chown(cache["path"], 4242, 4242)
    model, said = _load()
    _refused_once(cache, said, f"owned by uid 4242, not by this user (uid {os.geteuid()})")
    _serves_transformers(model)


def test_a_file_others_can_write_is_not_read(cache: dict[str, Any], genuine: dict[str, Any]) -> None:
    _plant(cache["path"], genuine["raw"])
    os.chmod(cache["path"], 0o622)
    model, said = _load()
    _refused_once(cache, said, "writable by group or others (mode 0622)")
    _serves_transformers(model)


def test_a_200_mb_file_is_refused_unread(cache: dict[str, Any]) -> None:
    with open(cache["path"], "wb") as f:
        f.truncate(200 << 20)  # (sparse: no 200 MB written)
    os.chmod(cache["path"], 0o600)
    model, said = _load()
    _refused_once(cache, said, f"209,715,200 bytes, more than the {draft_cache.MAX_BYTES:,} one can hold")
    _serves_transformers(model)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_folder_others_can_write_is_neither_read_nor_written(mode: int, cache: dict[str, Any],
                                                                genuine: dict[str, Any]) -> None:
    """A planted wrong read in a world-writable cache is not served: the folder is not read at all."""
    wrong = _kept(genuine, lambda s: s.replace('attention_output: "output[0]"', 'attention_output: "o_proj.input"', 1))
    _plant(cache["path"], wrong)
    os.chmod(cache["folder"], mode)
    model, said = _load()
    folder = cache["folder"]
    assert said == [f"{folder} is writable by group or others (mode {mode:04o}): nothing in it is read (`chmod go-w "
                    f"{folder}` to use it); helium is drafted afresh in memory"]
    assert cache["drafts"] == [1] and cache["path"].read_bytes() == wrong  # (nor written)
    _serves_transformers(model)


def test_new_folders_are_0700_and_files_0600(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             genuine: dict[str, Any]) -> None:
    monkeypatch.setattr(userspec, "draft_verified", lambda *a, **k: (registry.add_user(genuine["verified"].module),
                                                                      genuine["verified"])[1])
    monkeypatch.setenv("NNATLAS_CACHE", str(tmp_path / "a" / "b"))
    old = os.umask(0)  # (the most permissive umask: the modes are what nnatlas asks, not what the umask leaves)
    try:
        _forget()
        nnatlas.wrap(_helium(), draft=True)
    finally:
        os.umask(old)
        _forget()
    for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "drafts"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    for p in (tmp_path / "a" / "b" / "drafts").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


# ---- a user's spec: data, but a spec others can change can serve wrong values ----

def _user_spec(tmp_path: Path, genuine: dict[str, Any]) -> Path:
    spec = tmp_path / "specs" / "my_helium.yaml"
    spec.parent.mkdir()
    spec.write_text(genuine["data"]["spec"].replace("family: helium", "family: my_helium", 1))
    return spec


def test_a_spec_others_can_write_is_said_in_one_line(tmp_path: Path, genuine: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _user_spec(tmp_path, genuine)
    for target, mode, line in [
            (spec, 0o666, f"{spec} is writable by others (mode 0666): `chmod go-w {spec}`"),
            (spec.parent, 0o777, f"{spec} is in a folder others can write (mode 0777), where anyone can replace it: "
                                 f"`chmod go-w {spec.parent}`")]:
        os.chmod(target, mode)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = nnatlas.wrap(_helium(), spec=spec)
        said = [str(w.message) for w in caught if issubclass(w.category, safe_files.UnsafeFolderWarning)]
        assert said == [f"{line} (a spec others can change can serve wrong values)"]
        assert model.family == "my_helium"
        os.chmod(target, 0o755 if target.is_dir() else 0o644)
        _forget()
    monkeypatch.setenv("NNATLAS_SPECS", str(spec.parent))  # an NNATLAS_SPECS folder: the same line
    os.chmod(spec.parent, 0o777)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert nnatlas.wrap(_helium()).family == "my_helium"
    assert [str(w.message) for w in caught if issubclass(w.category, safe_files.UnsafeFolderWarning)] == [
        f"{spec} is in a folder others can write (mode 0777), where anyone can replace it: `chmod go-w {spec.parent}` "
        "(a spec others can change can serve wrong values)"]
    os.chmod(spec.parent, 0o755)
    _forget()
    with warnings.catch_warnings(record=True) as caught:  # a folder with the sticky bit (/tmp): no one replaces it
        warnings.simplefilter("always")
        os.chmod(spec.parent, 0o1777)
        nnatlas.wrap(_helium(), spec=spec)
    assert [w for w in caught if issubclass(w.category, safe_files.UnsafeFolderWarning)] == []
    os.chmod(spec.parent, 0o755)
    _forget()


def test_a_yaml_bomb_in_a_users_spec_is_one_line(tmp_path: Path, genuine: dict[str, Any]) -> None:
    spec = _user_spec(tmp_path, genuine)
    spec.write_text(spec.read_text().replace("title:", _BOMB + "\ntitle:", 1))
    with pytest.raises(nnatlas.NnatlasError) as e:
        nnatlas.wrap(_helium(), spec=spec)
    assert str(e.value).splitlines() == [
        f"the spec {spec} does not compile (1 problem):",
        f"{spec}:7:5: anchor 'a0': " + "anchors and aliases are not allowed in specs: each entry must stand on the "
        "line that an error or a page points to. Share between families with extends: (or a part under "
        "specs/parts/), else write the entry again"]
    _forget()


# ---- two processes, one cache ----

HOLDER = r"""
import fcntl, os, sys, time
from pathlib import Path
lock, kept, hold, data = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]).read_bytes()
fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")  # (as nnatlas keeps a draft: whole, then renamed)
fd2 = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd2, data[: len(data) // 2])  # half of it written: a reader must never see this
time.sleep(hold)
os.write(fd2, data[len(data) // 2:])
os.close(fd2)
os.replace(tmp, kept)
os.close(fd)
"""


def _holder(cache: dict[str, Any], genuine: dict[str, Any], tmp_path: Path, hold: float) -> Any:
    import subprocess
    import sys

    source = tmp_path / "genuine.json"
    source.write_bytes(genuine["raw"])
    lock = cache["path"].with_suffix(".lock")
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(cache["path"]), str(hold), str(source)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    return p


def test_a_load_waits_for_another_process_drafting_the_same_model(cache: dict[str, Any], genuine: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    """Another process holds the digest's lock (drafting), its file half written under a temporary name: this load
    waits for its turn, then serves what it kept, drafting nothing."""
    holder = _holder(cache, genuine, tmp_path, hold=1.5)
    model, said = _load()
    holder.communicate(timeout=60)
    assert holder.returncode == 0
    assert said == [] and cache["drafts"] == []  # (it waited: without the lock it finds nothing kept, and drafts)
    assert "(kept from an earlier load;" in registry.origin(model._family)
    _serves_transformers(model)
    assert sorted(p.name for p in cache["folder"].iterdir()) == [cache["path"].name, cache["path"].stem + ".lock"]


def test_a_turn_not_given_within_the_timeout_drafts_beside_it(cache: dict[str, Any], genuine: dict[str, Any],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(draft_cache, "LOCK_TIMEOUT_S", 0.3)
    holder = _holder(cache, genuine, tmp_path, hold=20)
    try:
        model, said = _load()
    finally:
        holder.kill()
        holder.communicate()
    lock = cache["path"].with_suffix(".lock")
    assert len(said) == 1 and re.fullmatch(rf"another process has been drafting helium into {re.escape(str(cache['folder']))} "
                                           rf"for \d+ s \(its lock {re.escape(str(lock))}\); drafted here too", said[0]), said
    assert cache["drafts"] == [1]
    _serves_transformers(model)
    assert cache["path"].read_bytes() == genuine["raw"]


RANK = r"""
import json, sys, time
from pathlib import Path
import torch, torch.distributed as dist, transformers, nnatlas
from nnatlas import registry
from nnatlas.compiler import userspec
rank, here = int(sys.argv[1]), Path(sys.argv[2])
counts = {"drafted": 0, "barriers": 0}
real, real_barrier = userspec.draft_verified, dist.barrier
def counted(*a, **k):
    counts["drafted"] += 1
    return real(*a, **k)
def barrier(*a, **k):
    counts["barriers"] += 1
    return real_barrier(*a, **k)
userspec.draft_verified, dist.barrier = counted, barrier
dist.init_process_group("gloo", init_method=f"file://{here / 'store'}", rank=rank, world_size=2)
torch.manual_seed(0)
config = transformers.HeliumConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, head_dim=8)
native = transformers.HeliumForCausalLM(config).eval()
model = nnatlas.wrap(native, draft=True)
ids = torch.tensor([[2, 5, 9, 4, 7, 11]])
with model.trace({"input_ids": ids}):
    logits = model.logits.save()
with torch.no_grad():
    ok = torch.equal(logits, native(input_ids=ids).logits)
print(json.dumps({**counts, "ok": ok, "origin": registry.origin(model._family)}))
dist.destroy_process_group()
"""


def test_under_torch_distributed_rank_0_drafts_and_the_other_rank_waits(tmp_path: Path) -> None:
    """Two gloo ranks load the same model with draft=True into one cache: rank 0 drafts, rank 1 waits on the barrier
    and serves what rank 0 kept (no second draft); both serve transformers' logits."""
    import subprocess
    import sys

    env = {**os.environ, "NNATLAS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(tmp_path)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
    got = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        got.append(json.loads(out.strip().splitlines()[-1]))
    assert [g["ok"] for g in got] == [True, True] and [g["drafted"] for g in got] == [1, 0], got
    assert [g["barriers"] for g in got] == [1, 1], got
    assert "(kept from an earlier load;" not in got[0]["origin"] and "(kept from an earlier load;" in got[1]["origin"]
    assert sorted(p.suffix for p in (tmp_path / "cache" / "drafts").iterdir()) == [".json", ".lock"]
