"""The sites of module-level functions (``fn:`` read points) and ``route_kernels``, for one trace.

A host's forward calls a kernel of its modeling module (``torch_chunk_gated_delta_rule``) by its
global name. For one trace, that global is swapped for ``sites``' dispatcher (refcounted, shared by
traces), the host's forward is wrapped so that the calls it makes are its (``sites._FN_HOST``), and each
of its calls goes to a handler here, which serves the call's arguments and output; under
``route_kernels`` the handler runs the kernel token by token through its pure-torch step and serves
each step. Unlike the other sites (``installers``), these are built afresh for each trace.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..errors import NnatlasError
from . import sites
from .protocols import WrappedModel
from .requests import FN_SITES, Request, SiteKey


class FunctionInstaller:
    """Installs one trace's function sites: ``serve`` and ``by_site`` are the trace's."""

    def __init__(self, serve: Callable[[SiteKey, Any], Any], by_site: dict[SiteKey, list[Request]]):
        self.serve, self.by_site = serve, by_site

    def install(self, model: WrappedModel, installed: list[Any], restore: list[Callable[[], None]]
                ) -> dict[tuple[int, str], Callable[..., Any]]:
        """Swap the functions the trace reads (and those route_kernels runs token by token) for this
        trace; returns their routes (``sites._FN_ROUTES``): (host module, function name) -> handler."""
        family = model._family
        wanted: dict[int, tuple[torch.nn.Module, set[str]]] = {}
        for key, reqs in self.by_site.items():
            if key.kind in FN_SITES:
                assert reqs[0].target is not None
                mod = reqs[0].target.module
                wanted.setdefault(id(mod), (mod, set()))[1].add(key.name)  # type: ignore[arg-type]
        routed = model._kernel_route()
        if routed == "torch":
            for mod, group in model._routed_modules():
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
            serve = self.serve
            names, kw = serve(SiteKey("fn_args", mid, group), (names, kw))
            if route is not None:
                out = self._token_by_token(mid, group, route, namespace, kw)
            else:
                # called as the forward called it: what was positional stays positional (a wrapper
                # may hand it to an implementation whose parameters have other names)
                rest = dict(kw)
                positional = [rest.pop(n) for n in names[:len(args)]]
                out = original(*positional, **rest)
            return serve(SiteKey("fn_output", mid, group), out)

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
