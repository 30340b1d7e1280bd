"""One direction: specs → compiler → generated → runtime. The runtime never imports the compiler,
``import nnatlas`` loads neither the compiler nor its dependencies, and the import graph has no circles
where it has been untangled. Read from the source (``tests/imports.py``) and checked in a fresh process."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import sizes

from . import imports as I  # the import graph, read from the source

# the runtime's one door to the compiler: ``python -m nnatlas generate ...`` hands the command line to
# the compiler's CLI (the program's entry point; nothing imports it)
ENTRY = "nnatlas.__main__"
# and its one second door: a user's own spec (``nnatlas.load(path, spec=FILE)``, ``wrap(model, spec=FILE)``,
# NNATLAS_SPECS) is compiled at load with generate's validation, which is the compiler's; this module imports it only
# inside the function a user spec calls (see the tests below: ``import nnatlas``, a wrap and a trace load no compiler)
USER_SPECS = "nnatlas.loading.user_specs"


def _fresh(code: str) -> dict[str, list[str]]:
    """Run ``code`` in a fresh interpreter; the modules it left loaded, grouped as the tests ask."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return {"compiler": [m for m in loaded if m == "nnatlas.compiler" or m.startswith("nnatlas.compiler.")],
            "deps": [m for m in loaded if m.split(".")[0] in ("jinja2", "pydantic", "markupsafe", "yaml")],
            "torch": [m for m in loaded if m == "torch"]}


def test_import_nnatlas_loads_no_compiler_no_torch() -> None:
    loaded = _fresh("import nnatlas")
    assert loaded == {"compiler": [], "deps": [], "torch": []}


def test_wrapping_and_tracing_load_no_compiler() -> None:
    """The whole runtime at work (every family adapter, a wrap, a trace) never loads the compiler (transformers
    itself loads jinja2 for chat templates, so only the compiler's own modules are counted here)."""
    loaded = _fresh("import nnatlas, torch\n"
                    "from nnatlas import testing\n"
                    "nnatlas.all_families()\n"
                    "model = testing.build('llama')\n"
                    "with model.trace('a b c'):\n"
                    "    out = model.layers[0].layer_output.save()\n"
                    "assert out.shape[-1] == model.hidden_size")
    assert loaded["compiler"] == []


def test_the_runtime_never_imports_the_compiler() -> None:
    """Not at module level, not inside a function: only the program's entry point hands over to it, and the user
    specs' door, only inside a function."""
    g = I.graph("nnatlas", "nnatlas.compiler", "nnatlas.families")
    runtime = [m for m in I.modules("nnatlas") if not m.startswith(("nnatlas.compiler", "nnatlas.families"))]
    found = [f"{i.source}:{i.line} imports {i.target}" for m in runtime if m not in (ENTRY, USER_SPECS) for i in g[m]
             if i.target.startswith("nnatlas.compiler")]
    assert found == []
    door = [i for i in g[USER_SPECS] if i.target.startswith("nnatlas.compiler")]
    assert door and all(i.local for i in door), door
    text = [f"{m}: {i.target}" for m in runtime if m != ENTRY
            for i in I.imports(I.modules("nnatlas")[m]) if i.target.split(".")[0] in ("jinja2", "pydantic")]
    assert text == []


def test_generated_adapters_import_the_runtime_only() -> None:
    g = I.graph("nnatlas", "nnatlas.compiler", "nnatlas.families")
    for name in I.modules("nnatlas.families"):
        bad = [i.target for i in g[name] if i.target.startswith("nnatlas.compiler")]
        assert bad == [], name


def test_compiler_has_no_import_circles() -> None:
    assert I.circles(I.graph("nnatlas.compiler")) == []


def test_the_runtime_has_no_import_circles() -> None:
    """Imports under ``if TYPE_CHECKING:`` count: a lower layer annotates against ``nnatlas.trace.protocols``
    (or a class of its own layer or below), never against the model facade above it."""
    g = I.graph("nnatlas")
    assert any(i.typing for imps in g.values() for i in imps)  # (the graph holds them: nnatlas/__init__.py's)
    assert I.circles(g) == []


def test_the_import_graph_counts_type_checking_imports() -> None:
    init = I.imports(I.modules("nnatlas")["nnatlas"], set(I.modules("nnatlas")))
    typing = {i.target for i in init if i.typing}
    assert {"nnatlas.model", "nnatlas.loading.load", "nnatlas.cache.model_cache"} <= typing
    assert not any(i.typing for i in init if i.target == "nnatlas.errors")  # (imported to run)


# the runtime's rooms, bottom up: a module imports only from its own room or those below (TYPE_CHECKING imports
# included); a room is a subpackage (every module under it), or one module at the top of the package
ROOMS = (
    ("data model", {"nnatlas.errors", "nnatlas.spec", "nnatlas.registry", "nnatlas.safe_files"}),
    ("trace", {"nnatlas.trace"}),
    ("inputs and parallel", {"nnatlas.inputs", "nnatlas.parallel"}),
    ("tree", {"nnatlas.tree"}),
    ("cache", {"nnatlas.cache"}),
    ("views", {"nnatlas.views"}),
    ("model facade", {"nnatlas.model"}),
    ("patching", {"nnatlas.patching"}),
    ("loading", {"nnatlas.loading"}),
    ("entry points", {"nnatlas", "nnatlas.cli", "nnatlas.__main__"}),
)
# at most this many modules at the top of runtime/ (the facade and its shared leaves); the rest live in rooms
TOP_MODULES = 10


def room_of(module: str) -> str:
    """The room a runtime module lives in: ``nnatlas.trace.tracer`` -> ``nnatlas.trace``, a top module itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or module in SUBPACKAGES else module


SUBPACKAGES = {f"nnatlas.{p.name}" for p in (I.ROOT / "runtime").iterdir() if (p / "__init__.py").is_file()}


def test_the_runtime_is_in_rooms() -> None:
    g = I.graph("nnatlas")
    runtime = {m for m in g if not m.startswith("nnatlas.testing")}
    level = {r: k for k, (_, rooms) in enumerate(ROOMS) for r in rooms}
    rooms = {room_of(m) for m in runtime}
    assert rooms == set(level), f"unplaced: {sorted(rooms - set(level))}, gone: {sorted(set(level) - rooms)}"
    upward = [f"{m} ({ROOMS[level[room_of(m)]][0]}) imports {i.target} ({ROOMS[level[room_of(i.target)]][0]})"
              for m in runtime for i in g[m] if level[room_of(i.target)] > level[room_of(m)]]
    assert upward == []
    top = sorted(p.name for p in (I.ROOT / "runtime").glob("*.py"))
    assert len(top) <= TOP_MODULES, top


def test_every_room_says_its_job_and_what_it_may_import() -> None:
    for room in sorted(SUBPACKAGES - {"nnatlas.testing"}):
        doc = ast.get_docstring(ast.parse((I.ROOT / "runtime" / room.split(".")[1] / "__init__.py").read_text()))
        assert doc and "May import:" in doc, room
    for room in ("language", "resolve", "emit", "status", "draft"):
        doc = ast.get_docstring(ast.parse((I.ROOT / "compiler" / room / "__init__.py").read_text()))
        assert doc, room


def test_a_room_that_imports_upward_fails_the_rooms_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rooms test can fail: a trace module that imported the tree would be named."""
    real = I.graph

    def graph(*packages: str) -> dict[str, list[I.Import]]:
        g = real(*packages)
        g["nnatlas.trace.tracer"] = [*g["nnatlas.trace.tracer"], I.Import("nnatlas.trace.tracer", "nnatlas.tree.hosts", 1, False)]
        return g

    monkeypatch.setattr(I, "graph", graph)
    with pytest.raises(AssertionError, match=r"nnatlas.trace.tracer \(trace\) imports nnatlas.tree.hosts \(tree\)"):
        test_the_runtime_is_in_rooms()


# the compiler's rooms, bottom up, held as the runtime's are
COMPILER_ROOMS = (
    ("errors", {"nnatlas.compiler.errors"}),
    ("the spec language", {"nnatlas.compiler.language"}),
    ("resolve", {"nnatlas.compiler.resolve"}),
    ("status", {"nnatlas.compiler.status"}),
    ("emit", {"nnatlas.compiler.emit"}),
    ("the compiler's face", {"nnatlas.compiler"}),
    ("draft", {"nnatlas.compiler.draft"}),
    ("user specs", {"nnatlas.compiler.userspec"}),
    ("entry points", {"nnatlas.compiler.cli", "nnatlas.compiler.newspec", "nnatlas.compiler.draft_sweep",
                      "nnatlas.compiler.typecheck"}),
)


def test_the_compiler_is_in_rooms() -> None:
    g = I.graph("nnatlas.compiler")
    folders = {f"nnatlas.compiler.{p.name}" for p in (I.ROOT / "compiler").iterdir() if (p / "__init__.py").is_file()}

    def room(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:3]) if ".".join(parts[:3]) in folders else m

    level = {r: k for k, (_, rooms) in enumerate(COMPILER_ROOMS) for r in rooms}
    assert {room(m) for m in g} == set(level)
    upward = [f"{m} imports {i.target}" for m in g for i in g[m] if level[room(i.target)] > level[room(m)]]
    assert upward == []


def test_the_rooms_are_named_in_order() -> None:
    """Bottom up: the data model, the trace, inputs and tensor parallel, the tree of hosts and values, the cache,
    the pictures and notebook views, the model facade, the loaders, the entry points."""
    names = [name for name, _ in ROOMS]
    assert names == ["data model", "trace", "inputs and parallel", "tree", "cache", "views", "model facade", "patching", "loading",
                     "entry points"]


# the command lines load the model only when a command runs (``nnatlas cache --help`` stays quick)
DEFERRED = {"nnatlas.__main__", "nnatlas.cli.cache", "nnatlas.cli.ranks", "nnatlas.cli.rows", "nnatlas.cli.out"}


def test_the_runtime_imports_its_modules_at_module_level() -> None:
    """No import inside a function hides a circle: each module's imports of nnatlas are at its top."""
    g = I.graph("nnatlas")
    local = [f"{i.source}:{i.line} imports {i.target}" for m, imps in g.items() if m not in DEFERRED
             for i in imps if i.local]
    assert local == []


def test_nnatlas_testing_imports_the_runtime_and_is_never_imported_by_it() -> None:
    g = I.graph("nnatlas")
    runtime = [m for m in g if not m.startswith("nnatlas.testing")]
    assert [f"{m} imports {i.target}" for m in runtime for i in g[m] if i.target.startswith("nnatlas.testing")] == []
    assert any(i.target == "nnatlas.model" for m in g if m.startswith("nnatlas.testing") for i in g[m])


def test_no_global_torch_setting_at_import() -> None:
    """Importing nnatlas, its test helpers and every family adapter leaves torch's thread count alone."""
    code = ("import torch\nbefore = torch.get_num_threads()\nimport nnatlas, nnatlas.testing\n"
            "nnatlas.all_families()\nassert torch.get_num_threads() == before == 2, torch.get_num_threads()\n")
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, env=env)


def test_the_size_report_names_the_largest_modules_and_classes() -> None:
    mods = sizes.modules()
    assert mods == sorted(mods, key=lambda s: (-s.lines, s.name))
    biggest = mods[0]
    assert biggest.lines == len((I.ROOT / biggest.name).read_text().splitlines())
    text = sizes.report(3)
    assert text.splitlines()[0].startswith("largest modules") and biggest.name in text
    cls = sizes.classes()[0]
    assert cls.methods > 0 and f"{cls.lines:5d}  {cls.methods:3d}  {cls.name}" in text


# no hand-written module in runtime/ or compiler/ over this many lines (split by concern, not by line count)
MAX_MODULE_LINES = 600
OVERSIZED: set[str] = set()  # a module allowed over the limit for now, with the reason (none today)


def oversized_modules() -> list[str]:
    """The hand-written modules of runtime/ and compiler/ over MAX_MODULE_LINES, but those OVERSIZED allows."""
    return [f"{s.name} ({s.lines} lines)" for s in sizes.modules() if s.name.startswith(("runtime/", "compiler/"))
            and s.lines > MAX_MODULE_LINES and s.name not in OVERSIZED]


def test_no_hand_written_module_is_over_600_lines() -> None:
    assert oversized_modules() == []
    assert all((I.ROOT / name).is_file() for name in OVERSIZED), "an allowed module is gone: drop its entry"

# ---- one data model: the compiler builds the runtime's own ----

# what the compiler's core (resolve, emit, the IR, expressions, read points) may import of the runtime
DATA_MODEL = {"nnatlas.spec", "nnatlas.trace.conditions", "nnatlas.tree.foreign_names"}
# the compiler's tools that run models with the runtime, and what each uses of it: the public API
# (printouts: nnatlas.wrap on the meta device, and tensor_parallel.planned, what support() says under TP, for pages)
TOOLS = {"nnatlas.compiler.emit.printouts": {"nnatlas", "nnatlas.parallel.tensor_parallel"},
         "nnatlas.compiler.resolve.treecheck": {"nnatlas", "nnatlas.tree.introspect", "nnatlas.tree.fit", "nnatlas.testing.suite"},
         "nnatlas.compiler.cli": {"nnatlas.cli.cache"},  # the `nnatlas cache` command
         # a draft's oracle on a tiny twin (draft=True), the draft put in the lookup while it is verified
         "nnatlas.compiler.userspec": {"nnatlas.testing.suite", "nnatlas.registry"},
         # the drafter's tiny model: the twins' sizes (one shrink rule), laid out and perturbed as the tests do
         "nnatlas.compiler.draft.tiny_config": {"nnatlas.testing.suite"},
         "nnatlas.compiler.draft.tiny": {"nnatlas.testing.suite"},
         "nnatlas.compiler.draft.tiny_build": {"nnatlas.testing"},
         # the structural options a draft pins where it found no kinds along them, by the tests' layout rule
         "nnatlas.compiler.draft.writer": {"nnatlas.testing.suite"},
         # whether a shipped family loads a type's tiny model; the checkpoint-like layout, by the tests' rule
         "nnatlas.compiler.draft_sweep": {"nnatlas.registry", "nnatlas.testing.suite"}}


def test_the_compiler_imports_the_runtimes_data_model_only() -> None:
    g = I.graph("nnatlas", "nnatlas.compiler", "nnatlas.families")
    for name in I.modules("nnatlas.compiler"):
        used = {i.target for i in g[name] if not i.target.startswith("nnatlas.compiler")}
        assert used <= DATA_MODEL | TOOLS.get(name, set()), f"{name} imports {sorted(used)}"


def _runtime_private_members() -> set[str]:
    """The runtime's private member names (``_module``, ``_specs_for``, ``_parent`` …): its classes' own
    methods and attributes, what it sets on ``self``, and the keys it keeps in instance dicts."""
    import ast
    import re

    names: set[str] = set()
    for path in I.modules("nnatlas").values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for b in node.body:
                    if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(b.name)
                    elif isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                        names.add(b.target.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == "self":  # (not a config's own, set by a site)
                names.add(node.attr)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                names.add(str(node.slice.value))
    return {n for n in names if re.fullmatch(r"_[a-z]\w*", n)}


def test_the_compiler_reaches_no_private_runtime_member() -> None:
    """The compiler's tools use the runtime's public API (``nnatlas.tree.introspect`` for a host's module, label,
    parent and children): no private member of a runtime object (an attribute, an instance-dict key, a
    ``getattr`` name) and no underscore name imported from the runtime. The drafter's generated conftest
    (text it writes) is held to the same rule."""
    import ast

    from nnatlas.compiler.draft import check as draft_check

    private = _runtime_private_members()
    assert {"_module", "_specs_for", "_parent", "_child", "_family"} <= private
    found = []
    sources = {name: path.read_text() for name, path in I.modules("nnatlas.compiler").items()}
    sources["the drafter's conftest"] = draft_check.CONFTEST
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if isinstance(node, ast.Attribute) and node.attr in private and not own:
                found.append(f"{name}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in private:
                found.append(f"{name}:{node.lineno} {node.value!r}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nnatlas") and \
                    not (node.module or "").startswith("nnatlas.compiler") and not node.level:
                found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if a.name.startswith("_")]
    assert found == []


def test_generated_adapters_hold_what_the_compiler_built() -> None:
    """The adapter written for llama holds exactly the ValueSpecs, Layouts and Conditions the compiler
    resolved: one data model, written out, not a second one kept in step by hand."""
    from nnatlas.compiler import compile_atlas
    from nnatlas.compiler.emit import emit
    from nnatlas.compiler.language import readpoint
    from nnatlas.families import llama
    from nnatlas.spec import Condition, Layout, ReadPoint

    atlas = compile_atlas(I.ROOT / "specs", I.ROOT)
    f = next(x for x in atlas.families if x.name == "llama")
    assert isinstance(readpoint.parse("call:attention > op:softmax.output"), ReadPoint)
    written = [v for h in llama.FAMILY.hosts for v in h.values]
    resolved = [v for h in f.hosts for v in h.values]
    assert len(written) == len(resolved)
    for v, ir in zip(written, resolved, strict=True):
        assert isinstance(ir.layout, Layout) and (ir.needs is None or isinstance(ir.needs, Condition))
        built = emit.value_spec(ir, "derive" if ir.derived is not None else None)
        assert built == v, v.name  # (a derive function is compared by name of its read, not identity)


def test_every_vocabulary_condition_is_decided_by_the_runtime(spec_root: Path) -> None:
    from nnatlas.compiler import SpecError, compile_atlas
    from nnatlas.trace import conditions

    atlas = compile_atlas(I.ROOT / "specs", I.ROOT)
    named = {c.name: c for f in atlas.families for h in f.hosts for v in h.values for c in (v.needs, v.reached) if c}
    for c in named.values():
        assert c.attribute or c.never or conditions.decided_here(c.name, c.kind), c
    vocab = spec_root / "specs" / "_vocabulary.yaml"
    vocab.write_text(vocab.read_text().replace("conditions:\n", "conditions:\n  sunny:\n    says: needs sun\n"
                                                                   "    fix: wait\n", 1))
    with pytest.raises(SpecError, match="condition sunny: the runtime decides no load condition of that name "
                                        r"\(it decides eager, processor, torch_kernels\)"):
        compile_atlas(spec_root / "specs", spec_root)


def test_one_expression_whitelist() -> None:
    from nnatlas import spec
    from nnatlas.compiler.language import expr
    from nnatlas.trace import expressions

    assert expr.FUNCTIONS is spec.FUNCTIONS and expr.VIEW_OPS is spec.VIEW_OPS
    assert expressions.unimplemented() == []


def test_a_drafted_adapter_goes_first_through_the_registrys_public_function() -> None:
    """``registry.put_first``, which the drafter's conftest calls: the adapter is the family of its name and
    is picked before the generated family of the same model type (in a fresh process: it changes the registry)."""
    code = ("import sys, types, transformers\n"
            "import nnatlas.families as fams\n"
            "from nnatlas import registry\n"
            "from nnatlas.families import mistral\n"
            "draft = types.ModuleType('nnatlas.families.mistral')\n"
            "exec(compile(open(mistral.__file__).read(), 'draft', 'exec'), draft.__dict__)\n"
            "assert registry.get('mistral') is mistral.FAMILY and list(registry.all_families())[0] != 'mistral'\n"
            "registry.put_first(draft)\n"
            "assert list(registry.all_families())[0] == 'mistral' and registry.get('mistral') is draft.FAMILY\n"
            "assert sys.modules['nnatlas.families.mistral'] is draft and fams.mistral is draft\n"
            "hf = transformers.MistralForCausalLM(transformers.MistralConfig(hidden_size=16, intermediate_size=32,"
            " num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=32))\n"
            "assert registry.pick(hf) is draft.FAMILY\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, capture_output=True)


def test_the_architecture_page_layout_names_every_runtime_room() -> None:
    """docs/architecture.md's layout section shows the runtime's rooms as they are: every room, none gone."""
    text = (I.ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    rows = block.split("runtime/", 1)[1]
    for room in sorted(SUBPACKAGES):
        assert f"{room.split('.')[1]}/" in rows, f"docs/architecture.md's layout does not name runtime/{room.split('.')[1]}/"


def test_the_architecture_page_draws_both_stacks_in_their_order() -> None:
    """docs/architecture.md's drawing of the rooms: every room of ROOMS and COMPILER_ROOMS, bottom up as the tests
    above hold them (a room drawn above another imports it, never the other way)."""
    text = (I.ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## The rooms", 1)[1].split("```", 2)[1].strip("\n").splitlines()
    split = block[0].index("compiler (")  # the compiler's column
    for stack, column in ((ROOMS, slice(0, split)), (COMPILER_ROOMS, slice(split, None))):
        rows = [" ".join(line[column].split()) for line in block]
        heights = []
        for name, _ in stack:
            key = " ".join(name.split()[:2])  # a label may go on below ("inputs and" / "parallel")
            at = [k for k, r in enumerate(rows) if r == key or r.startswith(key + " ")]
            assert at, f"the drawing does not name the room {name!r}"
            heights.append(at[0])
        assert heights == sorted(heights, reverse=True), [n for n, _ in stack]
