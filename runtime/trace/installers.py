"""Each site mechanism beside its installer: how a trace puts its sites on the model for one forward.

:class:`SiteInstaller` (one per model) turns the requests grouped by site (``by_site``) into the
mechanisms of ``nnatlas.trace.sites``: a wrapper of a module's ``forward`` (boundaries), a handler of an
interface call (attention, experts), op scopes (operations in a forward or a call), a module's own
method, a module-level function's dispatcher (and ``route_kernels``). What it builds for a layout of
sites is kept as a :class:`Plan` and reused by the next trace with the same layout, while what it was
built on is unchanged: the wrappers read the running trace from the installer's :class:`Live`, so a
reused plan only writes its functions into the module instances and takes them off again. Every
change a trace makes is listed in ``installed`` (handles with ``remove()``) or ``restore`` (undo
functions), which the tracer undoes in its ``finally``. What it reads of the tracer is only ``serve``
(a site fired: serve its requests), the requests by site and the running trace's dict of call dims.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from ..errors import NnatlasError
from . import op_scopes, patterns, sites
from .protocols import WrappedModel
from .requests import RUNNING_TRACE, Request, SiteKey

_running = RUNNING_TRACE.get  # (a wrapper asks it on every call: the trace whose forward runs here)
_MISSING: Any = object()  # a module's ``__dict__`` held no entry under the name
PLANS_KEPT = 16  # installations a model keeps for reuse (the least recently built go first)


def _unbound(key: SiteKey, payload: Any) -> Any:
    raise NnatlasError("a site fired with no trace running (an installation outlived its trace)")


class Live:
    """The trace a model's installed wrappers serve now (a model has one trace at a time: its lock):
    its ``serve``, its token (``RUNNING_TRACE``'s value: a call from another context is not its call)
    and its requests by site. Cleared when the trace ends, so that nothing keeps the trace alive."""

    __slots__ = ("serve", "mine", "by_site")

    def __init__(self) -> None:
        self.serve: Callable[[SiteKey, Any], Any] = _unbound
        self.mine: dict[int, tuple[int, int]] | None = None
        self.by_site: dict[SiteKey, list[Request]] = {}

    def clear(self) -> None:
        self.serve, self.mine, self.by_site = _unbound, None, {}


class _Shadow:
    """One name a plan puts on a module instance: what was there before, and the plan's own function."""

    __slots__ = ("d", "name", "previous", "cls", "cls_fn", "final")

    def __init__(self, mod: torch.nn.Module, name: str):
        self.d: dict[str, Any] = mod.__dict__
        self.name = name
        self.previous: Any = self.d.get(name, _MISSING)
        # a wrapper of the class's method holds the method found when it was built: the class must still have it
        self.cls: type | None = type(mod) if self.previous is _MISSING else None
        self.cls_fn: Any = getattr(self.cls, name, None) if self.cls is not None else None
        self.final: Any = None


class Plan:
    """What the sites of one trace put on the model, built once for a layout of sites and reused by the
    traces after it with the same layout (a loop over prompts with the same body, a bench): its
    wrappers (written into the module instances and taken away again around each forward), the
    interface handlers, the op names to swap, the routed configs and the modules that give views their
    call dims. It holds the modules it wraps, so the ids in its key stay theirs. It is valid while
    what it was built on is unchanged: each instance's own attribute, the class's method it wraps,
    the children of a module whose ops it counts, the attention implementation where it chose a
    recomputation, ``op_scopes.FORCE_OP_MODE``. A module replaced in the model stays held by the plans
    that wrap it until the next plan is built (``SiteInstaller._sweep``) or 16 newer ones push them out."""

    __slots__ = ("shadows", "routes", "route_configs", "op_names", "dims_modules", "children", "impls", "force",
                 "modules", "scoped", "plain")

    def __init__(self) -> None:
        self.shadows: dict[tuple[int, str], _Shadow] = {}
        self.routes: dict[tuple[str, int], Callable[..., Any]] = {}
        self.route_configs: list[tuple[str, Any, torch.nn.Module]] = []  # (interface, config, a module routed)
        self.op_names: set[str] = set()
        self.dims_modules: list[torch.nn.Module] = []
        self.children: list[tuple[torch.nn.Module, tuple[torch.nn.Module | None, ...]]] = []
        self.impls: list[tuple[Any, str | None]] = []
        self.force = op_scopes.FORCE_OP_MODE
        self.modules: set[int] = set()  # the ids of every module it holds (filled when built)
        self.scoped = False  # whether it counts ops (op scopes: a forward may push a TorchFunctionMode)
        # only wrappers of instances' attributes (no op names to swap, interface routes, dims hooks): what
        # ``SiteInstaller.reuse`` puts on and takes off alone
        self.plain = False

    def valid(self) -> bool:
        if self.force is not op_scopes.FORCE_OP_MODE:
            return False
        for sh in self.shadows.values():
            if sh.d.get(sh.name, _MISSING) is not sh.previous or (
                    sh.cls is not None and getattr(sh.cls, sh.name, None) is not sh.cls_fn):
                return False
        for mod, children in self.children:
            now = tuple(mod._modules.values())
            if len(now) != len(children) or any(a is not b for a, b in zip(now, children, strict=True)):
                return False
        return not self.impls or all(sites.attention_implementation(cfg) == impl for cfg, impl in self.impls)

    def put_on(self) -> None:
        for sh in self.shadows.values():
            sh.d[sh.name] = sh.final

    def take_off(self) -> None:
        for sh in self.shadows.values():
            if sh.previous is _MISSING:
                sh.d.pop(sh.name, None)
            else:
                sh.d[sh.name] = sh.previous


class Plans(dict[Any, Plan]):
    """The plans an installer keeps, by layout; and the traces replayed on them (``replays``: each holds one of these
    plans, and they all go whenever a plan goes or is replaced, whoever removes it)."""

    def __init__(self) -> None:
        super().__init__()
        # the traces of plain saves replayed (``nnatlas.trace.replay``), by the id of their first target
        self.replays: dict[int, Any] = {}

    def __setitem__(self, key: Any, plan: Plan) -> None:
        self.replays.clear()
        super().__setitem__(key, plan)

    def __delitem__(self, key: Any) -> None:
        self.replays.clear()
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        self.replays.clear()
        return super().pop(*args)

    def popitem(self) -> tuple[Any, Plan]:
        self.replays.clear()
        return super().popitem()

    def clear(self) -> None:
        self.replays.clear()
        super().clear()


def installer_of(model: WrappedModel) -> SiteInstaller:
    """The model's installer (made on its first trace), which keeps its plans."""
    d = model.__dict__
    installer: SiteInstaller | None = d.get("_site_installer")
    if installer is None:
        installer = d["_site_installer"] = SiteInstaller()
    return installer


class SiteInstaller:
    """Installs the sites of a model's traces (see the module's docstring). One per model: it keeps
    the plans it built (:class:`Plan`) for the traces after."""

    def __init__(self) -> None:
        self.live = Live()
        self.plans = Plans()
        self.replays = self.plans.replays  # (dropped with any plan: nothing here outlives the plans)
        self._building: Plan | None = None

    def install(self, root: torch.nn.Module, by_site: dict[SiteKey, list[Request]], serve: Callable[[SiteKey, Any], Any],
                call_dims: dict[int, tuple[int, int]], dims: tuple[torch.nn.Module, ...], installed: list[Any],
                restore: list[Callable[[], None]]) -> tuple[Any, Plan]:
        """Every site but the module-level functions' on the model ``root``: (the plan's key, the plan: its
        ``routes`` go to ``sites._ROUTES``). ``dims``: the modules whose calls give views their dims."""
        live = self.live
        live.serve, live.mine, live.by_site = serve, call_dims, by_site
        restore.append(live.clear)
        key = (tuple(by_site), dims)
        plan = self.plans.get(key)
        if plan is not None:
            if plan.valid():
                plan.put_on()
                restore.append(plan.take_off)
                if plan.op_names:
                    self._op_swaps(installed).split(plan.op_names)
            else:
                del self.plans[key]
                plan = None
        if plan is None:
            self._sweep(root)
            plan = self._build(dims, installed, restore)  # (its wrappers written, its op names swapped)
            if len(self.plans) >= PLANS_KEPT:
                del self.plans[next(iter(self.plans))]
            self.plans[key] = plan
        if plan.dims_modules:
            for dm in plan.dims_modules:
                installed.append(dm.register_forward_pre_hook(self._dims_hook, with_kwargs=True, prepend=True))
        if plan.route_configs:
            self._acquire_routes(plan, restore)
        return key, plan

    def reuse(self, by_site: dict[SiteKey, list[Request]], serve: Callable[[SiteKey, Any], Any],
              call_dims: dict[int, tuple[int, int]]) -> tuple[Any, Plan] | None:
        """A trace's sites laid out as an earlier trace's (no view dims), whose plan is still valid and
        plain (``Plan.plain``): (its key, the plan), with ``live`` pointed at this trace; its wrappers go on
        with ``plan.put_on()`` and off with :meth:`off`. None where :meth:`install` is needed (nothing changed)."""
        key = (tuple(by_site), ())
        plan = self.plans.get(key)
        if plan is None or not plan.plain or not plan.valid():
            return None
        live = self.live
        live.serve, live.mine, live.by_site = serve, call_dims, by_site
        return key, plan

    def off(self, plan: Plan) -> None:
        """Take a reused plain plan's wrappers off and clear ``live`` (what :meth:`install` leaves to ``restore``)."""
        plan.take_off()
        self.live.clear()

    def _sweep(self, root: torch.nn.Module) -> None:
        """Drop the plans that hold a module no longer in the model (one replaced between traces): a
        plan holds the modules it wraps, and would keep a replaced module, weights and all, alive.
        Run before each build (a layout not seen before), not on reuse."""
        if self.plans:
            present = {id(m) for m in root.modules()}
            for key in [k for k, p in self.plans.items() if not p.modules <= present]:
                del self.plans[key]

    def forget(self, key: Any) -> None:
        """Build afresh next time (a forward that raised may have left a wrapper's state half way)."""
        self.plans.pop(key, None)

    def remember(self, replay: Any) -> None:
        """Keep a trace of plain saves for replay (``nnatlas.trace.replay.Replay``; at most ``PLANS_KEPT``)."""
        if len(self.replays) >= PLANS_KEPT:
            self.replays.clear()
        self.replays[id(replay.targets[0])] = replay

    def _build(self, dims: tuple[torch.nn.Module, ...], installed: list[Any], restore: list[Callable[[], None]]) -> Plan:
        plan = self._building = Plan()
        plan.dims_modules = list(dims)
        restore.append(plan.take_off)  # (first: what a build wrote is taken away even if it raises)
        try:
            self._install(plan, installed)
        finally:
            self._building = None
        for sh in plan.shadows.values():
            sh.final = sh.d[sh.name]
        plan.modules = {mid for mid, _ in plan.shadows} | {id(m) for _, _, m in plan.route_configs} | {
            id(m) for m in plan.dims_modules} | {id(c) for _, children in plan.children for c in children if c is not None}
        return plan

    def _put_on(self, mod: torch.nn.Module, name: str, fn: Callable[..., Any]) -> None:
        """Put ``fn`` on the module instance as ``name`` (shadowing the class's method, or wrapping what
        was on the instance), in the plan being built."""
        plan = self._building
        assert plan is not None
        key = (id(mod), name)
        if key not in plan.shadows:
            plan.shadows[key] = _Shadow(mod, name)
        mod.__dict__[name] = fn

    def _acquire_routes(self, plan: Plan, restore: list[Callable[[], None]]) -> None:
        """Put the router of each routed interface under the name its config reads (the config is
        never touched: model code comparing the name takes the same branch as outside)."""
        names: dict[tuple[str, str | None], None] = {}
        for interface, cfg, mod in plan.route_configs:
            if cfg is None:
                raise NnatlasError(f"{type(mod).__name__} has no config to route its {interface} through")
            names[(interface, getattr(cfg, sites.CONFIG_ATTRIBUTE[interface]))] = None
        for interface, impl in names:
            sites.acquire(interface, impl)
            restore.append(functools.partial(sites.release, interface, impl))

    def _install(self, plan: Plan, installed: list[Any]) -> None:
        modules: dict[int, torch.nn.Module] = {}
        bounds: dict[int, list[SiteKey | None]] = {}  # module -> [its pre site, its post site] (those read)
        fwd_ops: dict[int, set[str]] = {}
        interfaces: dict[int, set[str]] = {}
        call_ops: dict[tuple[int, str], set[str]] = {}  # (module, interface) -> the ops read inside its calls
        methods: dict[int, set[str]] = {}
        for key, reqs in self.live.by_site.items():  # one pass: sites by module
            target = reqs[0].target
            assert target is not None
            mod = target.module
            mid = id(mod)
            modules[mid] = mod
            kind = key[0]
            if kind == "post" or kind == "pre":  # (the common case first)
                bound = bounds.get(mid)
                if bound is None:
                    bound = bounds[mid] = [None, None]
                bound[kind == "post"] = key
            elif kind == "op" and key.name is None:  # an operation of the module's own forward
                fwd_ops.setdefault(mid, set()).add(key.op)  # type: ignore[arg-type]
            elif kind in ("call_in", "call_out") or kind == "op":  # (an op inside an interface call)
                interfaces.setdefault(mid, set()).add(key.name)  # type: ignore[arg-type]
                if kind == "op" and key.op:
                    call_ops.setdefault((key.module, key.name), set()).add(key.op)  # type: ignore[arg-type]
            elif kind in ("method_in", "method_out"):
                methods.setdefault(mid, set()).add(key.name)  # type: ignore[arg-type]
        routes = plan.routes
        plan.scoped = bool(fwd_ops or call_ops)
        # forward wrappers nest in the order they are put on: a scope of ops innermost (so that a
        # module's own boundary sites are served outside it), then the boundary sites, then the
        # depth counters of the scopes' children outermost (a child's boundary sites are no op of
        # its parent's scope)
        children: list[Callable[[], None]] = []
        for mid, names in fwd_ops.items():
            children.append(self._install_forward_ops(modules[mid], names, installed))
        for mid, mod in modules.items():
            bound = bounds.get(mid)
            if bound is not None:
                self._wrap_forward(mod, bound[0], bound[1])
            if interfaces:
                for interface in sorted(interfaces.get(mid, ())):
                    routes[(interface, mid)] = self._call_handler(mid, interface, installed,
                                                                  call_ops.get((mid, interface), set()))
            if methods:
                for name in sorted(methods.get(mid, ())):
                    self._install_method(mod, name)
        for count_children in children:
            count_children()
        if routes:
            configs: dict[tuple[str, int], tuple[str, Any, torch.nn.Module]] = {}
            for interface, mid in routes:
                cfg = getattr(modules[mid], "config", None)
                configs.setdefault((interface, id(cfg)), (interface, cfg, modules[mid]))
            plan.route_configs = list(configs.values())
        for h in installed:
            if isinstance(h, op_scopes.OpSwaps):
                plan.op_names = set(h.names)
        plan.plain = not (plan.op_names or routes or plan.scoped or plan.dims_modules)

    def _dims_hook(self, mod: torch.nn.Module, args: Any, kwargs: Any) -> None:
        """The call's [batch, seq]: of the model's input ids, or its input embeddings."""
        call_dims = self.live.mine
        if call_dims is None or RUNNING_TRACE.get() is not call_dims:
            return
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None and args:
            x = args[0]
        if isinstance(x, torch.Tensor) and x.dim() >= 2:
            call_dims[id(mod)] = (int(x.shape[0]), int(x.shape[1]))

    def _install_method(self, mod: torch.nn.Module, name: str) -> None:
        """Route one module's own method through the tracer (an instance attribute, see ``_put_on``)."""
        mid = id(mod)
        original = getattr(mod, name)
        key_in, key_out = SiteKey("method_in", mid, name), SiteKey("method_out", mid, name)
        live = self.live

        def method(*args: Any, **kwargs: Any) -> Any:
            if _running() is not live.mine:  # another thread's (or context's) call: not this trace's
                return original(*args, **kwargs)
            args, kwargs = live.serve(key_in, (args, kwargs))
            out = original(*args, **kwargs)
            return live.serve(key_out, out)

        self._put_on(mod, name, method)

    def _wrap_forward(self, mod: torch.nn.Module, pre_key: SiteKey | None, post_key: SiteKey | None) -> None:
        """Serve a module's boundary sites from its own ``forward``: an instance attribute wraps the
        forward ``Module.__call__`` would run (the class's, or one accelerate put on the instance)
        while a trace runs, and is taken away afterwards. It sees what forward hooks would see
        (the call's args and kwargs, the output) inside any hooks on the module, and costs a
        quarter of a forward hook (which sends every call of the module down torch's slow path)."""
        original = mod.forward
        # the forward of a trace runs in the context where RUNNING_TRACE is that trace's own dict
        # (``live.mine``): a call of the module from another thread (a plain forward beside it) is left alone
        live = self.live
        forward: Callable[..., Any]
        if pre_key is not None and post_key is not None:
            def forward(*args: Any, **kwargs: Any) -> Any:
                if _running() is not live.mine:
                    return original(*args, **kwargs)
                serve = live.serve
                args, kwargs = serve(pre_key, (args, kwargs))
                return serve(post_key, original(*args, **kwargs))
        elif pre_key is not None:
            def forward(*args: Any, **kwargs: Any) -> Any:
                if _running() is not live.mine:
                    return original(*args, **kwargs)
                args, kwargs = live.serve(pre_key, (args, kwargs))
                return original(*args, **kwargs)
        else:
            post: SiteKey = post_key  # type: ignore[assignment]  # (one of the two is read)

            def forward(*args: Any, **kwargs: Any) -> Any:
                if _running() is not live.mine:
                    return original(*args, **kwargs)
                return live.serve(post, original(*args, **kwargs))

        self._put_on(mod, "forward", forward)

    def _op_server(self, mid: int, scope: str | None) -> Callable[[str, int, str, Any], Any]:
        live = self.live

        def serve(name: str, k: int, side: str, payload: Any) -> Any:
            return live.serve(("op", mid, scope, name, k, side), payload)  # type: ignore[arg-type]  # a SiteKey's fields
        return serve

    def _op_swaps(self, installed: list[Any]) -> op_scopes.OpSwaps:
        """This forward's swapped torch callables: one set per trace, undone with its hooks."""
        for h in installed:
            if isinstance(h, op_scopes.OpSwaps):
                return h
        swaps = op_scopes.OpSwaps()
        installed.append(swaps)
        return swaps

    def _install_forward_ops(self, mod: torch.nn.Module, names: set[str], installed: list[Any]) -> Callable[[], None]:
        """Count ``names`` in ``mod``'s own forward (its children's forwards are not counted): an op
        scope (``op_scopes.run_scoped``) entered by a wrapper of the instance's forward. Returns what puts
        the depth counters on the children (called after every other wrapper is on, so that they
        wrap those too)."""
        plan = self._building
        assert plan is not None
        serve = self._op_server(id(mod), None)
        if "softmax" in names:
            cfg = getattr(mod, "config", None)
            impl = sites.attention_implementation(cfg)
            plan.impls.append((cfg, impl))
            if impl == "sdpa":
                # eager's softmax read where the forward calls sdpa instead (recompute: sdpa; patterns)
                serve, names = patterns.softmax_from_sdpa(serve, mod), names | {patterns.SDPA}
        swapped, fallback = self._op_swaps(installed).split(names)
        running: list[tuple[op_scopes.OpScope | None, op_scopes.OpMode | None]] = []
        original = mod.forward
        live = self.live

        def forward(*args: Any, **kwargs: Any) -> Any:
            if _running() is not live.mine:
                return original(*args, **kwargs)
            return op_scopes.run_scoped(original, args, kwargs, swapped, fallback, serve, running)

        self._put_on(mod, "forward", forward)

        def count_children() -> None:
            plan.children.append((mod, tuple(mod._modules.values())))
            for child in mod.children():
                inner = child.forward

                def counted(*args: Any, inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
                    if _running() is not live.mine or not running:
                        return inner(*args, **kwargs)
                    scope, mode = running[-1]
                    if scope is not None:
                        scope.depth += 1
                    if mode is not None:
                        mode.depth += 1
                    try:
                        return inner(*args, **kwargs)
                    finally:
                        if scope is not None:
                            scope.depth -= 1
                        if mode is not None:
                            mode.depth -= 1

                self._put_on(child, "forward", counted)

        return count_children

    def _call_handler(self, mid: int, interface: str, installed: list[Any], ops: set[str]) -> Callable[..., Any]:
        """The handler of ``mid``'s calls of ``interface``, counting ``ops`` (the op names read inside them)."""
        serve = self._op_server(mid, interface)
        key_in, key_out = SiteKey("call_in", mid, interface), SiteKey("call_out", mid, interface)
        swapped: set[str] = set()
        fallback: set[str] = set()
        if ops:
            swapped, fallback = self._op_swaps(installed).split(ops)

        def scoped(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return op_scopes.run_scoped(fn, args, kwargs, swapped, fallback, serve)

        live = self.live

        def handler(original: Callable[..., Any], module: torch.nn.Module, args: tuple[Any, ...],
                    kwargs: dict[str, Any], name: str | None, caller: FrameType) -> Any:
            full_args, kwargs = live.serve(key_in, ((module, *args), kwargs))
            if ops and interface == "attention" and name in patterns.RECOMPUTED:
                # sdpa / flex (the name the call was routed under): the fused call gives the output, the
                # eager function the calling forward would have run gives the reads (patterns)
                out = original(*full_args, **kwargs)
                patterns.recompute(sites.caller_eager_attention(module, caller), full_args, kwargs, scoped)
            elif ops:
                out = scoped(original, full_args, kwargs)
            else:
                out = original(*full_args, **kwargs)
            return live.serve(key_out, out)

        return handler
