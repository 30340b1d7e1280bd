"""The five workloads, each as (plain, ours) callables on one model, plus nnsight's where installed.

(a) an empty trace; (b) saving every layer's output; (c) saving every standard value the load
serves (eager attention); (d) an in-place edit at every layer; (e) generating 16 tokens with one
value saved per step. Baselines: the same forward / generate call on the bare transformers model.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nnatlas.model import AtlasModel
from nnatlas.testing import standard_values
from nnatlas.trace.requests import CallDim

GEN_TOKENS = 16
CASES = {
    "a": "empty trace",
    "b": "save every layer output",
    "c": "save every standard value (eager)",
    "d": "edit every layer",
    "e": f"generate {GEN_TOKENS}, save 1/step",
}


@dataclass
class Workload:
    case: str
    plain: Callable[[], Any]
    ours: Callable[[], Any]
    theirs: Callable[[], Any] | None = None
    note: str = ""
    values: int = 0  # the values it reads or edits per call (make bench splits a miss's cost over them)
    # the same reads with a bare mechanism and nothing else (no library): what the mechanism alone costs
    floors: dict[str, Callable[[], Any]] = field(default_factory=dict)


def layer_names(model: AtlasModel) -> list[str]:
    """The name of each block's ``layer_output`` (``output`` when the family names none)."""
    return ["layer_output" if any(v.name == "layer_output" for s in layer._specs() for v in s.values) else "output"
            for layer in model.layers]


def layer_values(model: AtlasModel, names: list[str] | None = None) -> list[Any]:
    """Each block's ``layer_output`` handle, as a user names it (``model.layers[i].layer_output``);
    ``names`` from :func:`layer_names`, worked out once outside the timed body."""
    names = names if names is not None else layer_names(model)
    return [getattr(layer, name) for layer, name in zip(model.layers, names)]


def generate_settings(model: AtlasModel) -> dict[str, Any]:
    settings: dict[str, Any] = {"max_new_tokens": GEN_TOKENS, "min_new_tokens": GEN_TOKENS, "do_sample": False}
    pad = getattr(model.tokenizer, "pad_token_id", None)
    settings["pad_token_id"] = pad if pad is not None else 0
    return settings


# ---- ours --------------------------------------------------------------------------------------

def ours_workloads(model: AtlasModel, eager: AtlasModel, inputs: dict[str, torch.Tensor]) -> dict[str, Workload]:
    hf, hf_eager = model.native, eager.native
    settings = generate_settings(model)

    def plain() -> Any:
        with torch.no_grad():
            return hf(**inputs)

    def plain_eager() -> Any:
        with torch.no_grad():
            return hf_eager(**inputs)

    def plain_generate() -> Any:
        with torch.no_grad():
            return hf.generate(**inputs, **settings)

    def empty() -> None:
        with model.trace(inputs):
            pass

    names = layer_names(model)  # which name each block's output goes by: the bench's lookup, done once

    def save_layers() -> list[Any]:
        with model.trace(inputs):
            saved = [v.save() for v in layer_values(model, names)]
        return saved

    # which hosts exist is the bench's enumeration, done once; each trace names every value afresh
    pairs = [(h._host, h._name) for h in standard_values(eager, needs_images=False)]  # text prompts

    def save_all() -> list[Any]:
        with eager.trace(inputs, order="any"):
            saved = [getattr(host, name).save() for host, name in pairs]
        return saved

    def edit_layers() -> None:
        with model.trace(inputs):
            for v in layer_values(model, names):
                v[:, 0] = 0

    last = len(model.layers) - 1

    def generate() -> list[Any]:
        with model.generate(inputs, max_new_tokens=GEN_TOKENS) as tracer:
            saved = [getattr(model.layers[last], names[last]).save() for _ in tracer.iter[:]]
        return saved

    return {
        "a": Workload("a", plain, empty),
        "b": Workload("b", plain, save_layers, values=len(names), floors=floors(model, inputs, layer_values(model, names))),
        "c": Workload("c", plain_eager, save_all, values=len(pairs)),
        "d": Workload("d", plain, edit_layers, values=len(names)),
        "e": Workload("e", plain_generate, generate, values=GEN_TOKENS),
    }


# ---- floors: the bare mechanisms ------------------------------------------------------------------

def value_module(handle: Any) -> torch.nn.Module:
    """The native module a module read point (``read.kind == "module"``) is read at."""
    return handle._host._resolve_module(handle._read.module, handle.label)  # type: ignore[no-any-return]


def hooked_forward(root: torch.nn.Module, inputs: dict[str, torch.Tensor], handles: list[Any]) -> None:
    """One plain forward of ``root`` with torch hooks on, taken off again whatever happens."""
    try:
        with torch.no_grad():
            root(**inputs)
    finally:
        for h in handles:
            h.remove()


def floors(model: AtlasModel, inputs: dict[str, torch.Tensor], values: list[Any]) -> dict[str, Callable[[], Any]]:
    """(b) with no library, for the why of a miss: the modules whose outputs ``values`` (b's handles)
    read, read by torch forward hooks, and by bare wrappers of the instances' ``forward`` (nnatlas'
    mechanism for a module's output, without its recording, checks and serving). Empty when a
    value reads anything but a module's output."""
    if any(v._read.kind != "module" or v._read.side != "output" for v in values):
        return {}
    modules = [value_module(v) for v in values]
    hf = model.native

    def hooks() -> list[Any]:
        saved: list[Any] = []
        hooked_forward(hf, inputs, [m.register_forward_hook(lambda _m, _a, out: saved.append(out)) for m in modules])
        return saved

    def wrappers() -> list[Any]:
        saved: list[Any] = []
        before = [m.__dict__.get("forward") for m in modules]  # (an instance's own forward, accelerate's)
        for m in modules:
            def forward(*args: Any, _original: Callable[..., Any] = m.forward, **kwargs: Any) -> Any:
                out = _original(*args, **kwargs)
                saved.append(out)
                return out
            m.__dict__["forward"] = forward
        try:
            with torch.no_grad():
                hf(**inputs)
        finally:
            for m, previous in zip(modules, before, strict=True):
                if previous is None:
                    del m.__dict__["forward"]
                else:
                    m.__dict__["forward"] = previous
        return saved

    return {"hooks": hooks, "wrappers": wrappers}


# ---- nnsight -----------------------------------------------------------------------------------

def nnsight_available() -> bool:
    try:
        import nnsight  # noqa: F401
    except ImportError:
        return False
    return True


class Theirs:
    """The same reads through nnsight, on a separate copy of the model (nnsight wraps modules)."""

    def __init__(self, model: AtlasModel):
        from nnsight import LanguageModel

        self.ours = model
        self.hf = copy.deepcopy(model.native)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.nn = LanguageModel(self.hf, tokenizer=model.tokenizer)
        self.names = {id(m): n for n, m in model.native.named_modules()}

    dims: tuple[int, int] = (1, 1)  # [batch, seq] of the workloads' inputs, for views that name them
    passed: dict[int, dict[str, int | str]]  # module -> parameter -> its position in the call, or its name

    def probe(self, inputs: dict[str, torch.Tensor]) -> None:
        """How each module's forward is called (which parameters come by position), from one plain
        forward: nnsight indexes a module's ``inputs`` as (args, kwargs) as they were passed."""
        from nnatlas.trace.requests import forward_params

        self.passed = {}
        root = self.ours.native

        def record(mod: torch.nn.Module, args: Any, kwargs: Any) -> None:
            names = forward_params(mod)
            seen: dict[str, int | str] = {name: i for i, name in enumerate(names[:len(args)])}
            seen.update({k: k for k in kwargs})
            self.passed.setdefault(id(mod), seen)

        hooked_forward(root, inputs, [m.register_forward_pre_hook(record, with_kwargs=True) for m in root.modules()])

    def _bind(self, a: Any) -> Any:
        if isinstance(a, CallDim):
            return self.dims[0] if a.name == "batch" else self.dims[1]
        if isinstance(a, tuple):
            return tuple(self._bind(x) for x in a)
        return a

    def envoy(self, module: torch.nn.Module) -> Any:
        node = self.nn
        name = self.names[id(module)]
        for part in name.split(".") if name else ():
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        return node

    def proxy(self, handle: Any) -> Any:
        """nnsight's proxy for one of our value handles (same site, same access, same view)."""
        read, host = handle._read, handle._host
        if read.kind == "module":
            module = value_module(handle)
            env = self.envoy(module)
            if read.side == "output":
                x = env.output
            elif read.side == "inputs":
                x = env.inputs
            elif read.param is not None:  # by name where the forward passed it so, else by position
                where = self.passed.get(id(module), {}).get(read.param)
                x = env.inputs[0][where] if isinstance(where, int) else env.inputs[1][read.param]
            else:
                x = env.input
        elif read.kind in ("call", "op"):
            # the forward whose source holds the call or op: the host's, or the module its path names
            env = self.envoy(self.ours._scope_module(host, read, handle.label))
            src = env.source
            if read.kind == "call" or read.call:
                call = [n for n in src.names if n.startswith(f"{read.call or read.text.split(':')[1].split('.')[0]}_interface")
                        or n.startswith("attention_interface")][-1]
                src = getattr(src, call)
                if read.kind == "op":
                    src = src.source  # into the called function's own source
            if read.kind == "op":
                op = [n for n in src.names if n.endswith(f"{read.op}_{read.occurrence}")][0]
                src = getattr(src, op)
            x = src.inputs[0] if read.side in ("args", "input") else src.output
        else:
            raise ValueError(f"{handle.label} is derived")
        for a in read.access:
            x = getattr(x, a) if isinstance(a, str) else x[a]
        spec = handle._spec
        for v in (spec.view if spec else ()):
            x = getattr(x, v.name)(*(self._bind(self.ours._view_arg(a)) for a in v.args))
        for e in handle._extra:
            x = x[e]
        return x


def serve_order(model: AtlasModel, inputs: dict[str, torch.Tensor], handles: list[Any]) -> list[Any]:
    """The handles in the order the forward computes them (nnsight serves in that order only)."""
    order: list[str] = []
    with model.trace(inputs, order="any") as tracer:
        for h in handles:
            if h._read.kind != "derived":
                h.save()
        serve = tracer.serve
        seen: set[str] = set()

        def record(key: Any, payload: Any) -> Any:  # (put on before the forward's sites are installed)
            out = serve(key, payload)
            for r in tracer.by_site.get(key, ()):
                if r.done and r.label not in seen:
                    seen.add(r.label)
                    order.append(r.label)
            return out

        tracer.serve = record  # type: ignore[method-assign]
    rank = {label: i for i, label in enumerate(order)}
    return sorted((h for h in handles if h._read.kind != "derived"), key=lambda h: rank[h.label])


def theirs_workloads(model: AtlasModel, eager: AtlasModel, inputs: dict[str, torch.Tensor]
                     ) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """nnsight's version of each workload, and a note for each one it cannot do."""
    t, te = Theirs(model), Theirs(eager)
    ids = inputs["input_ids"]
    t.dims = te.dims = (int(ids.shape[0]), int(ids.shape[1]))
    t.probe(inputs)
    te.probe(inputs)
    nn, nne = t.nn, te.nn
    every = standard_values(eager, needs_images=False)
    # nnsight reads modules' inputs and outputs and the calls in a forward's source; a value read at
    # a module-level function (fn:, the DeltaNet kernel), an operator (``a * b``) or inside a call
    # nnsight does not expand has no nnsight equivalent, and neither has a value derived from one:
    # (c) then compares both libraries on the values nnsight can read, each tried once here
    readable, missing = [], []
    for h in every:
        if h._read.kind == "derived":
            continue
        try:
            if h._read.kind == "fn":
                raise ValueError("a module-level function")
            with nne.trace(inputs):
                te.proxy(h).save()
        except Exception:  # noqa: BLE001 - counted in the table's note
            missing.append(h)
        else:
            readable.append(h)
    gone = {h.label for h in missing}
    derived = [h for h in every if h._read.kind == "derived"
               and not any(getattr(h._host, d).label in gone for d in h._spec.read.deps)]
    handles = serve_order(eager, inputs, readable)
    settings = generate_settings(model)
    lv = layer_values(model)
    out: dict[str, Callable[[], Any]] = {}
    notes: dict[str, str] = {}

    def empty() -> None:
        with nn.trace(inputs):
            pass

    def save_layers() -> list[Any]:
        saved = []
        with nn.trace(inputs):
            for h in lv:
                saved.append(t.proxy(h).save())
        return saved

    def save_all() -> dict[str, Any]:
        saved: dict[str, Any] = {}
        with nne.trace(inputs):
            for h in handles:
                saved[h.label] = te.proxy(h).save()
        for h in derived:  # computed from the values it is derived from, as ours are
            spec = h._spec
            deps = {d: saved[getattr(h._host, d).label] for d in spec.read.deps}
            saved[h.label] = spec.read.derive(deps)
        return saved

    def edit_layers() -> None:
        with nn.trace(inputs):
            for h in lv:
                t.proxy(h)[:, 0] = 0

    def generate() -> list[Any]:
        saved = []
        with nn.generate(inputs, **settings) as tracer:
            for _ in tracer.iter[:GEN_TOKENS]:
                saved.append(t.proxy(lv[-1]).save())
        return saved

    for key, fn in (("a", empty), ("b", save_layers), ("c", save_all), ("d", edit_layers), ("e", generate)):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported in the table, not hidden
            notes[key] = f"nnsight: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        else:
            out[key] = fn
    if "c" in out and len(handles) + len(derived) < len(every):
        subset = [(h._host, h._name) for h in (*handles, *derived)]

        def ours_same() -> list[Any]:  # ours on exactly the values nnsight reads
            with eager.trace(inputs, order="any"):
                saved = [getattr(host, name).save() for host, name in subset]
            return saved

        out["c:ours"] = ours_same
        kinds = sorted({h._read.kind for h in missing})
        notes["c"] = (f"vs nnsight on the {len(subset)} of {len(every)} values it can read "
                      f"(not {len(every) - len(subset)}: {'/'.join(kinds)} reads and what derives from them)")
    return out, notes


