"""Each site mechanism beside its installer: how a trace puts its sites on the model for one forward.

:class:`SiteInstaller` turns the requests grouped by site (``by_site``) into the mechanisms of
``nnatlas.sites``: a wrapper of a module's ``forward`` (boundaries), a handler of an interface call
(attention, experts), op scopes (operations in a forward or a call), a module's own method, a
module-level function's dispatcher (and ``route_kernels``). Every change it makes is listed in
``installed`` (handles with ``remove()``) or ``restore`` (undo functions), which the tracer undoes
in its ``finally``. What it reads of the tracer is only ``serve`` (a site fired: serve its
requests), the requests by site and the running trace's dict of call dims.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from . import patterns, sites
from .errors import NnatlasError
from .protocols import WrappedModel
from .requests import FN_SITES, RUNNING_TRACE, Request, SiteKey

_running = RUNNING_TRACE.get  # (a wrapper asks it on every call: the trace whose forward runs here)


class SiteInstaller:
    """Installs the sites of one trace's requests (see the module's docstring)."""

    def __init__(self, model: WrappedModel, by_site: dict[SiteKey, list[Request]], call_dims: dict[int, tuple[int, int]],
                 serve: Callable[[SiteKey, Any], Any]):
        self.model, self.by_site, self.call_dims, self.serve = model, by_site, call_dims, serve

    def install(self, installed: list[Any], restore: list[Callable[[], None]]) -> dict[tuple[str, int], Callable[..., Any]]:
        """Every site but the module-level functions'; returns the interface routes (for ``sites._ROUTES``)."""
        return self._install(installed, restore)

    def install_functions(self, installed: list[Any], restore: list[Callable[[], None]]
                          ) -> dict[tuple[int, str], Callable[..., Any]]:
        """The module-level functions' sites (and route_kernels); returns their routes (``sites._FN_ROUTES``)."""
        return self._install_functions(installed, restore)

    def _install(self, installed: list[Any], restore: list[Callable[[], None]]
                 ) -> dict[tuple[str, int], Callable[..., Any]]:
        modules: dict[int, torch.nn.Module] = {}
        bounds: dict[int, list[SiteKey | None]] = {}  # module -> [its pre site, its post site] (those read)
        fwd_ops: dict[int, set[str]] = {}
        interfaces: dict[int, set[str]] = {}
        call_ops: dict[tuple[int, str], set[str]] = {}  # (module, interface) -> the ops read inside its calls
        methods: dict[int, set[str]] = {}
        dims_modules: dict[int, torch.nn.Module] = {}
        for key, reqs in self.by_site.items():  # one pass: sites by module
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
            for r in reqs:
                dims = r.target.dims_module  # type: ignore[union-attr]  # (every request in by_site has a target)
                if dims is not None:
                    dims_modules[id(dims)] = dims
        for dm in dims_modules.values():
            installed.append(dm.register_forward_pre_hook(self._dims_hook, with_kwargs=True, prepend=True))
        routes: dict[tuple[str, int], Callable[..., Any]] = {}
        # forward wrappers nest in the order they are put on: a scope of ops innermost (so that a
        # module's own boundary sites are served outside it), then the boundary sites, then the
        # depth counters of the scopes' children outermost (a child's boundary sites are no op of
        # its parent's scope)
        children: list[Callable[[], None]] = []
        for mid, names in fwd_ops.items():
            children.append(self._install_forward_ops(modules[mid], names, installed, restore))
        for mid, mod in modules.items():
            bound = bounds.get(mid)
            if bound is not None:
                self._wrap_forward(mod, bound[0], bound[1], restore)
            if interfaces:
                for interface in sorted(interfaces.get(mid, ())):
                    routes[(interface, mid)] = self._call_handler(mid, interface, installed,
                                                                  call_ops.get((mid, interface), set()))
            if methods:
                for name in sorted(methods.get(mid, ())):
                    self._install_method(mod, name, restore)
        for count_children in children:
            count_children()
        if routes:
            self._route(modules, routes, restore)
        return routes

    def _dims_hook(self, mod: torch.nn.Module, args: Any, kwargs: Any) -> None:
        """The call's [batch, seq]: of the model's input ids, or its input embeddings."""
        if RUNNING_TRACE.get() is not self.call_dims:
            return
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None and args:
            x = args[0]
        if isinstance(x, torch.Tensor) and x.dim() >= 2:
            self.call_dims[id(mod)] = (int(x.shape[0]), int(x.shape[1]))

    def _install_method(self, mod: torch.nn.Module, name: str, restore: list[Callable[[], None]]) -> None:
        """Route one module's own method through the tracer (an instance attribute, see ``_shadow``)."""
        mid = id(mod)
        original = getattr(mod, name)
        key_in, key_out = SiteKey("method_in", mid, name), SiteKey("method_out", mid, name)

        mine, current = self.call_dims, RUNNING_TRACE.get

        def method(*args: Any, **kwargs: Any) -> Any:
            if current() is not mine:  # another thread's (or context's) call: not this trace's
                return original(*args, **kwargs)
            args, kwargs = self.serve(key_in, (args, kwargs))
            out = original(*args, **kwargs)
            return self.serve(key_out, out)

        _shadow(mod, name, method, restore)
    # -- module-level functions (fn: read points) and route_kernels --
    def _install_functions(self, installed: list[Any], restore: list[Callable[[], None]]
                           ) -> dict[tuple[int, str], Callable[..., Any]]:
        family = self.model._family
        wanted: dict[int, tuple[torch.nn.Module, set[str]]] = {}
        for key, reqs in self.by_site.items():
            if key.kind in FN_SITES:
                assert reqs[0].target is not None
                mod = reqs[0].target.module
                wanted.setdefault(id(mod), (mod, set()))[1].add(key.name)  # type: ignore[arg-type]
        routed = self.model._kernel_route()
        if routed == "torch":
            for mod, group in self.model._routed_modules():
                wanted.setdefault(id(mod), (mod, set()))[1].add(group)
        routes: dict[tuple[int, str], Callable[..., Any]] = {}
        for mid, (mod, groups) in wanted.items():
            namespace = sites.forward_globals(mod)
            for g in sorted(groups):
                spec = family.functions.get(g)
                route = spec.route if (spec is not None and routed == "torch") else None
                for name in (spec.names if spec is not None else (g,)):
                    if (mid, name) in routes:
                        raise NnatlasError(f"{name} is read under two names on {type(mod).__name__}")
                    sites.acquire_function(namespace, name)
                    restore.append(functools.partial(sites.release_function, namespace, name))
                    routes[(mid, name)] = self._fn_handler(mid, g, route, namespace)
            self._host_functions(mod, restore)
        return routes

    @staticmethod
    def _host_functions(mod: torch.nn.Module, restore: list[Callable[[], None]]) -> None:
        """While ``mod``'s forward runs, the swapped functions it calls are its (``_FN_HOST``)."""
        mid = id(mod)
        original = mod.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            token = sites._FN_HOST.set(mid)
            try:
                return original(*args, **kwargs)
            finally:
                sites._FN_HOST.reset(token)

        _shadow(mod, "forward", forward, restore)

    def _fn_handler(self, mid: int, group: str, route: Any, namespace: dict[str, Any]) -> Callable[..., Any]:
        def handler(original: Callable[..., Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            names = _param_names(original)
            if len(args) > len(names):
                raise NnatlasError(f"{name} was called with {len(args)} positional arguments; nnatlas reads "
                                   f"functions whose parameters are named ({', '.join(names)})")
            kw = dict(zip(names, args))
            kw.update(kwargs)
            names, kw = self.serve(SiteKey("fn_args", mid, group), (names, kw))
            if route is not None:
                out = self._token_by_token(mid, group, route, namespace, kw)
            else:
                # called as the forward called it: what was positional stays positional (a wrapper
                # may hand it to an implementation whose parameters have other names)
                rest = dict(kw)
                positional = [rest.pop(n) for n in names[:len(args)]]
                out = original(*positional, **rest)
            return self.serve(SiteKey("fn_output", mid, group), out)

        return handler

    def _token_by_token(self, mid: int, group: str, route: Any, namespace: dict[str, Any], kw: dict[str, Any]) -> Any:
        """One call of a recurrent kernel, run one token at a time through the pure-torch step."""
        fn = inspect.unwrap(sites.original_function(namespace, route["torch"]))
        dim, state_arg, k = route["seq_dim"], route["state_arg"], route["state_output"]
        flag = route.get("final_state_flag")
        seqs = [v.shape[dim] for n, v in kw.items() if isinstance(v, torch.Tensor) and n != state_arg and v.dim() > dim]
        if not seqs:
            raise NnatlasError(f"{route['torch']}: no sequence argument to step through")
        seq = seqs[0]
        accepted = _param_names(fn)
        takes_any = _takes_kwargs(fn)
        state = kw.get(state_arg)
        outs: list[tuple[Any, ...]] = []
        for t in range(seq):
            step = {n: (v.narrow(dim, t, 1) if isinstance(v, torch.Tensor) and n != state_arg and v.dim() > dim
                        and v.shape[dim] == seq else v) for n, v in kw.items() if takes_any or n in accepted}
            step[state_arg] = state
            if flag:
                step[flag] = True
            out = tuple(fn(**step))
            out = tuple(self.serve(SiteKey("fn_step", mid, group), out))
            state = out[k]
            outs.append(out)
        result = []
        for i in range(len(outs[0]) if outs else 0):
            if i == k:
                result.append(state if (not flag or kw.get(flag)) else None)
            else:
                result.append(torch.cat([o[i] for o in outs], dim))
        if SiteKey("fn_steps", mid, group) in self.by_site:
            stacked = tuple(torch.stack([o[i] for o in outs], dim) if i == k else result[i] for i in range(len(result)))
            self.serve(SiteKey("fn_steps", mid, group), stacked)
        return tuple(result)

    def _wrap_forward(self, mod: torch.nn.Module, pre_key: SiteKey | None, post_key: SiteKey | None,
                      restore: list[Callable[[], None]]) -> None:
        """Serve a module's boundary sites from its own ``forward``: an instance attribute wraps the
        forward ``Module.__call__`` would run (the class's, or one accelerate put on the instance)
        for this trace only, and is taken away afterwards. It sees what forward hooks would see
        (the call's args and kwargs, the output) inside any hooks on the module, and costs a
        quarter of a forward hook (which sends every call of the module down torch's slow path)."""
        original = mod.forward
        serve = self.serve
        # the forward of this trace runs in the context where RUNNING_TRACE is this trace's own dict: a
        # call of the module from another thread (a plain forward beside the trace) is left alone
        mine = self.call_dims
        forward: Callable[..., Any]
        if pre_key is not None and post_key is not None:
            def forward(*args: Any, **kwargs: Any) -> Any:
                if _running() is not mine:
                    return original(*args, **kwargs)
                args, kwargs = serve(pre_key, (args, kwargs))
                return serve(post_key, original(*args, **kwargs))
        elif pre_key is not None:
            def forward(*args: Any, **kwargs: Any) -> Any:
                if _running() is not mine:
                    return original(*args, **kwargs)
                args, kwargs = serve(pre_key, (args, kwargs))
                return original(*args, **kwargs)
        else:
            post: SiteKey = post_key  # type: ignore[assignment]  # (one of the two is read)

            def forward(*args: Any, **kwargs: Any) -> Any:
                if _running() is not mine:
                    return original(*args, **kwargs)
                return serve(post, original(*args, **kwargs))

        _shadow(mod, "forward", forward, restore)

    def _op_server(self, mid: int, scope: str | None) -> Callable[[str, int, str, Any], Any]:
        def serve(name: str, k: int, side: str, payload: Any) -> Any:
            return self.serve(("op", mid, scope, name, k, side), payload)  # type: ignore[arg-type]  # a SiteKey's fields
        return serve

    def _op_swaps(self, installed: list[Any]) -> sites.OpSwaps:
        """This forward's swapped torch callables: one set per trace, undone with its hooks."""
        for h in installed:
            if isinstance(h, sites.OpSwaps):
                return h
        swaps = sites.OpSwaps()
        installed.append(swaps)
        return swaps

    def _install_forward_ops(self, mod: torch.nn.Module, names: set[str], installed: list[Any],
                             restore: list[Callable[[], None]]) -> Callable[[], None]:
        """Count ``names`` in ``mod``'s own forward (its children's forwards are not counted): an op
        scope (``sites.run_scoped``) entered by a wrapper of the instance's forward. Returns what puts
        the depth counters on the children (called after every other wrapper is on, so that they
        wrap those too)."""
        serve = self._op_server(id(mod), None)
        if "softmax" in names and sites.attention_implementation(getattr(mod, "config", None)) == "sdpa":
            # eager's softmax read where the forward calls sdpa instead (recompute: sdpa; patterns)
            serve, names = patterns.softmax_from_sdpa(serve, mod), names | {patterns.SDPA}
        swapped, fallback = self._op_swaps(installed).split(names)
        running: list[tuple[sites.OpScope | None, sites.OpMode | None]] = []
        original = mod.forward
        mine, current = self.call_dims, RUNNING_TRACE.get

        def forward(*args: Any, **kwargs: Any) -> Any:
            if current() is not mine:
                return original(*args, **kwargs)
            return sites.run_scoped(original, args, kwargs, swapped, fallback, serve, running)

        _shadow(mod, "forward", forward, restore)

        def count_children() -> None:
            for child in mod.children():
                inner = child.forward

                def counted(*args: Any, inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
                    if current() is not mine or not running:
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

                _shadow(child, "forward", counted, restore)

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
            return sites.run_scoped(fn, args, kwargs, swapped, fallback, serve)

        def handler(original: Callable[..., Any], module: torch.nn.Module, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
            full_args, kwargs = self.serve(key_in, ((module, *args), kwargs))
            if ops and interface == "attention" and sites.attention_implementation(getattr(module, "config", None)) in patterns.RECOMPUTED:
                # sdpa / flex: the fused call gives the output, eager's function the reads (patterns)
                out = original(*full_args, **kwargs)
                patterns.recompute(sites.eager_attention(module), full_args, kwargs, scoped)
            elif ops:
                out = scoped(original, full_args, kwargs)
            else:
                out = original(*full_args, **kwargs)
            return self.serve(key_out, out)

        return handler

    def _route(self, modules: dict[int, torch.nn.Module], routes: dict[tuple[str, int], Any],
               restore: list[Callable[[], None]]) -> None:
        """Put the router of each routed module's interface under the name its config reads (the
        config is never touched: model code comparing the name takes the same branch as outside)."""
        names: dict[tuple[str, str | None], None] = {}
        for interface, mid in routes:
            cfg = getattr(modules[mid], "config", None)
            if cfg is None:
                raise NnatlasError(f"{type(modules[mid]).__name__} has no config to route its {interface} through")
            names[(interface, getattr(cfg, sites.CONFIG_ATTRIBUTE[interface]))] = None
        for interface, impl in names:
            sites.acquire(interface, impl)
            restore.append(functools.partial(sites.release, interface, impl))


def _shadow(mod: torch.nn.Module, name: str, fn: Callable[..., Any], restore: list[Callable[[], None]]) -> None:
    """Put ``fn`` on the module instance as ``name`` (shadowing the class's method, or wrapping what
    was on the instance) for this trace only: ``restore`` gets what puts the old state back."""
    d = mod.__dict__
    restore.append(functools.partial(_unshadow, d, name, name in d, d.get(name)))  # (fewer objects than a closure)
    d[name] = fn


def _unshadow(d: dict[str, Any], name: str, had: bool, previous: Any) -> None:
    if had:
        d[name] = previous
    else:
        d.pop(name, None)


_PARAMS: dict[int, tuple[tuple[str, ...], bool]] = {}


def _signature(fn: Callable[..., Any]) -> tuple[tuple[str, ...], bool]:
    key = id(fn)
    if key not in _PARAMS:
        params = inspect.signature(fn).parameters.values()
        names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        _PARAMS[key] = (names, any(p.kind == p.VAR_KEYWORD for p in params))
    return _PARAMS[key]


def _param_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    return _signature(fn)[0]


def _takes_kwargs(fn: Callable[..., Any]) -> bool:
    return _signature(fn)[1]
