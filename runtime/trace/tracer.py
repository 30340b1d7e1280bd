"""A trace: the body records requests; the forward serves them at their sites.

``with model.trace(inputs):`` runs its body first. Each ``.save()``, assignment or in-place
edit there records a :class:`Request` in body order. On leaving the block the requests are
grouped by site, only those sites are instrumented, the forward runs once, and everything that
was installed is removed again, whatever happened. Saved values come back as tensors that
are views of what the model computed (``Tensor.data`` is pointed at them: no copy).

Requests are served in body order: a request whose site fires while an earlier request is
still waiting raises :class:`OutOfOrderError` naming both, as an interleaved trace would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextvars import Token
from typing import Any

import torch

from ..errors import InputError, NnatlasError, NotReached, OutOfOrderError
from . import conditions, interrupts, op_scopes, sites
from .function_sites import FunctionInstaller
from .installers import installer_of
from .placeholders import release
from .protocols import WrappedModel
from .requests import (
    INPUT_SIDES,
    RUNNING_TRACE,
    Box,
    Expr,
    Request,
    SiteKey,
    Target,
    _editable,
    _same,
    _seq,
    fill,
    save_with_grad,
)

# ---- the tracer ----------------------------------------------------------------------------

class Tracer:
    """The context of one ``model.trace(...)`` (or ``model.generate(...)``)."""

    # what every trace starts from (set on the instance when it changes)
    seq = 0
    current_call = -1
    current_step = 0
    step = 0
    output: Any = None
    _cursor = 0
    # (first, later): the first request still waiting when a later one's site fired; the forward then runs
    # on, serving nothing, counting only whether ``first``'s site fires: "computed later" (OutOfOrderError)
    # or "never fired" (NotReached)
    _late: tuple[Request, Request] | None = None
    _lock_held = False
    _guarded = False  # whether __enter__ counted in ``interrupts`` (the main thread's)
    grad_live = False  # whether this forward keeps autograd (trace(grad=True), with grad mode on)
    edits = False  # whether the body edits an input-side value (the forward then gets copies of the inputs)
    # made on first use while recording (most traces ask no load condition)
    conditions: dict[tuple[int, int], bool] | None = None  # load conditions asked while recording
    available: set[tuple[int, int, int]] | None = None  # (read point, condition, config) a save found served

    def __init__(self, model: WrappedModel, run: Callable[[], Any], order: str = "strict", grad: bool = False,
                 steps: int | None = None, calls: int | None = None, inputs: Mapping[str, Any] | None = None):
        if order != "strict" and order != "any":
            raise ValueError("order is 'strict' or 'any'")
        self.model = model
        self._run = run
        self.strict = order == "strict"
        self.grad = grad
        self.steps = steps
        self.inputs: Mapping[str, Any] = inputs or {}
        self._tokens = calls
        self.requests: list[Request] = []
        self._ordered: list[Request] = []
        self.by_site: dict[SiteKey, list[Request]] = {}
        self.fired: dict[int | tuple[int, int], int] = {}  # times each site fired (by id of its list in by_site, and step)
        self._state: set[int] | None = None  # the storages of the model's weights (made at the first in-place edit)
        self.call_dims: dict[int, tuple[int, int]] = {}

    @property
    def calls(self) -> int | None:
        """The tokens of this call (what ``tracer.iter`` walks in a trace): the given count, else the length
        of the inputs' ids (or embeddings), found when asked."""
        if self._tokens is None:
            ids = self.inputs.get("input_ids", self.inputs.get("inputs_embeds"))
            if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
                self._tokens = int(ids.shape[1])
        return self._tokens

    # -- recording (the body) --
    def add(self, label: str, action: str, target: Target | None, payload: Any = None, seq: int | None = None,
            **kw: Any) -> Request:
        if target is not None and "call" not in kw:
            kw["call"] = self.current_call if target.per_call else target.call
        if seq is None:
            seq = self.seq
            self.seq += 1
        r = Request(seq, label, action, target, payload, self.current_step, **kw)
        self.requests.append(r)
        if (action == "replace" or action == "setitem") and target is not None and target.side in INPUT_SIDES:
            self.edits = True
        return r

    @property
    def iter(self) -> _Steps:
        """Generation steps: ``for step in tracer.iter[0:3]:`` records the body once per step."""
        return _Steps(self)

    # -- the context manager --
    # Opening and closing are critical sections (``interrupts``): a signal landing in them, or in
    # what they call, waits until they end; one landing in the forward (``_forward``) or the body
    # raises at once, and the ``finally`` of ``_execute`` / ``__exit__`` takes everything away.
    @interrupts.critical
    def __enter__(self) -> Tracer:
        self._guarded = interrupts.enter()
        try:
            lock = self.model._lock
            if not lock.acquire(blocking=False):
                while not lock.acquire(timeout=0.05):  # another thread traces this model: wait, interruptibly
                    if interrupts.pending():
                        interrupts.deliver()
            self._lock_held = True
            if self.model._tracer is not None:
                raise NnatlasError("a trace of this model is already open; traces do not nest")
            object.__setattr__(self.model, "_tracer", self)  # (AtlasModel.__setattr__ is for its properties)
            if interrupts.pending():  # an interrupt while opening: close again, then raise it
                interrupts.deliver()
        except BaseException:
            self._close()
            raise
        return self

    @interrupts.critical
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self.model._tracer is self:
                object.__setattr__(self.model, "_tracer", None)
                if exc_type is None:
                    self._execute()
        finally:
            self._close()

    @interrupts.critical
    def _close(self) -> None:
        """Clear the model's tracer, release its lock and the signal handlers (idempotent)."""
        try:
            if self.model._tracer is self:
                object.__setattr__(self.model, "_tracer", None)
            self._release()
        finally:
            guarded, self._guarded = self._guarded, False
            interrupts.leave(guarded)

    def _release(self) -> None:
        if self._lock_held:
            self._lock_held = False
            self.model._lock.release()

    # -- serving (the forward) --
    def serve(self, key: SiteKey, payload: Any) -> Any:
        reqs = self.by_site.get(key)
        if reqs is None:
            return payload
        step = self.step
        fired = id(reqs) if step == 0 else (id(reqs), step)  # (a site's list of requests: one per site for the trace)
        n = self.fired.get(fired, 0)
        self.fired[fired] = n + 1
        strict = self.strict
        for r in reqs:
            if r.step != step:
                continue
            call = r.call
            if call != -1 and (r.done or call != n):
                continue
            if strict and r.ordered:  # the first request not served yet must be this one (_first_undone, inlined)
                ordered = self._ordered
                i, end = self._cursor, len(ordered)
                while i < end and (ordered[i].done or not ordered[i].ordered):
                    i += 1
                self._cursor = i
                if i < end and ordered[i].seq < r.seq:
                    return self._out_of_order(ordered[i], r, payload)
            t: Target = r.target  # type: ignore[assignment]  # (every request in by_site has one)
            if r.action == "save" and not t.copy:  # the common case, inlined: point the holder at the value
                get = t.get
                value = payload if get is _same else get(payload)
                holder = r.payload
                if self.grad_live:
                    save_with_grad(t, r, payload, value)
                elif type(holder) is torch.Tensor and isinstance(value, torch.Tensor):
                    holder.data = value
                else:
                    fill(holder, value, r.label)
                r.done = True
            else:
                payload = self._apply(r, payload)
        return payload

    def _out_of_order(self, first: Request, later: Request, payload: Any) -> Any:
        """``later``'s site fired while ``first`` still waits. From here the forward serves nothing; it
        only counts whether ``first``'s site fires (in a list of its own), and ``_execute`` raises, once the
        forward ends, the error that says which it was: computed later, or never reached."""
        self._late = (first, later)
        self.by_site = {k: [] for k, reqs in self.by_site.items() if any(q is first for q in reqs)}
        self.fired = {}
        return payload

    def _apply(self, r: Request, payload: Any) -> Any:
        t = r.target
        assert t is not None
        action = r.action
        if t.copy:
            native = t.native(payload)
            if isinstance(native, torch.Tensor):
                # (a rank's shard, save(local=True), is served as a new tensor: the forward keeps its own)
                copied = payload if t.sharded and t.local else t.with_native(payload, native.clone())  # type: ignore[attr-defined]
                if action == "save" or action == "capture":
                    # a snapshot: the forward goes on with its own tensor, which it may change in
                    # place later (Falcon adds the attention into the MLP's output), the save keeps
                    # what was produced
                    value = t.get(copied)
                    if action == "capture":
                        r.value = value
                    elif self.grad_live:
                        save_with_grad(t, r, payload, value)  # the hook on the tensor the forward goes on with
                    else:
                        fill(r.payload, value, r.label)
                        if t.sharded and type(r.payload) is not Box:
                            # save(local=True): a tensor's holder says which slice of the full value it is (a Box
                            # holds what is no tensor, a state that is None, the same on every rank)
                            r.payload.tp_shard = getattr(value, "tp_shard", None)
                    r.done = True
                    return self._finish(r, payload)
                payload = copied
        if action == "replace" or action == "setitem":  # both write into the tensor the forward holds
            if self.grad_live:
                payload = _editable(t, payload)
            payload = self._unshared(t, payload)
        if action == "save" or action == "capture":
            value = t.get(payload)
            if action == "capture":
                r.value = value
            elif self.grad_live:
                save_with_grad(t, r, payload, value)
            elif type(r.payload) is torch.Tensor and isinstance(value, torch.Tensor):
                r.payload.data = value  # fill(), inlined: the common case
            else:
                fill(r.payload, value, r.label)
        elif action == "replace":
            current = t.get(payload)
            new = self.resolve(r.payload, current, r.label)
            payload = t.replace(payload, new)
        else:  # setitem
            current = t.get(payload)
            key, val = r.payload
            # a number is written as it is (the same values as a full tensor, without making one)
            new = val if type(val) in (int, float, bool) else self.resolve(val, current[key], r.label)
            try:
                if t.sharded:  # the full value's element, written back into each rank's shard
                    payload = t.edit_in_place(payload, lambda served: served.__setitem__(key, new))  # type: ignore[attr-defined]
                else:
                    current[key] = new
            except (RuntimeError, IndexError, TypeError, ValueError) as e:
                raise InputError(t.edit_error(f"{r.label}[{key!r}] = ...", current, new, e)) from e
        r.done = True
        return self._finish(r, payload)

    def _unshared(self, t: Target, payload: Any) -> Any:
        """A value that is the model's own parameter or buffer (an op's operand: Gemma 4's ``layer_scalar``
        is the buffer ``mul_`` reads) is written in place on a copy put in its place: an edit changes this
        forward, never the model's weights."""
        native = t.native(payload)
        if isinstance(native, torch.Tensor):
            if self._state is None:  # the storages of the model's parameters and buffers, once per trace
                module = self.model._module
                # (a DTensor's storage is its local shard's: tensor parallel)
                self._state = {getattr(x, "_local_tensor", x).untyped_storage().data_ptr()
                               for x in (*module.parameters(), *module.buffers()) if x.device.type != "meta"}
            if native.untyped_storage().data_ptr() in self._state:
                return t.with_native(payload, native.clone())
        return payload

    def _finish(self, r: Request, payload: Any) -> Any:
        owner = r.owner
        if owner is not None and owner.action == "derived" and all(d.done for d in owner.deps or ()):
            values = {d.payload: d.value for d in owner.deps or ()}
            assert owner.derive is not None
            owner.value = owner.derive(values)
            if owner.payload is not None:
                fill(owner.payload, owner.value, owner.label, self.grad_live)
            owner.done = True
        return payload

    def resolve(self, val: Any, current: Any, label: str) -> Any:
        if isinstance(val, Expr):
            return val.evaluate(self, label)
        if isinstance(val, Request):
            return Expr(lambda x: x, (val,)).evaluate(self, label)
        if callable(val) and not isinstance(val, torch.Tensor):
            return val(current)
        if isinstance(val, int | float | bool) and isinstance(current, torch.Tensor):
            return torch.full_like(current, val)
        return val

    def _check_reached(self, sited: list[Request]) -> None:
        """A value whose call condition these inputs do not meet is never computed: say so now,
        before the forward, rather than let a later request wait on it."""
        missing = []
        for r in sited:
            cond = r.target.reached if r.target is not None else None
            if cond is not None and not conditions.call_met(cond.name, self.inputs):
                label = r.owner.label if r.owner is not None else r.label
                if (label, cond) not in missing:
                    missing.append((label, cond))
        if missing:
            parts = [f"{label} {cond.says}" for label, cond in missing]
            raise NotReached(f"{'; '.join(parts)}; this call has none, so the forward never computes "
                             f"{'it' if len(missing) == 1 else 'them'}. Fix: {missing[0][1].fix}")

    def _execute(self) -> None:
        ordered = self._ordered = sorted(self.requests, key=_seq)
        release([r.payload for r in ordered])  # the body's placeholders become plain tensors, to be filled
        by_site = self.by_site
        conditional = functions = derived = False
        dims: tuple[torch.nn.Module, ...] = ()  # the modules whose calls give views their dims
        for r in ordered:
            t = r.target
            if t is None:
                derived = True
            else:
                if t.reached is not None:
                    conditional = True
                if t.fn_site:
                    functions = True
                if t.dims_module is not None and t.dims_module not in dims:
                    dims = (*dims, t.dims_module)
                reqs = by_site.get(t.site)
                if reqs is None:
                    by_site[t.site] = [r]
                else:
                    reqs.append(r)
        if conditional:
            self._check_reached([r for r in ordered if r.target is not None])
        if self.edits:
            self._own_inputs()
        installed: list[Any] = []
        restore: list[Callable[[], None]] = []
        tokens: list[Token[Any]] = []
        installer = installer_of(self.model)
        grad = torch.is_grad_enabled()
        modes = torch._C._len_torch_function_stack()
        plan_key = None
        try:
            if ordered:  # (an empty trace installs nothing)
                plan_key, routes = installer.install(self.model._module, by_site, self.serve, self.call_dims, dims,
                                                     installed, restore)
                if routes:
                    tokens.append(sites._ROUTES.set(routes))
            if functions or self.model._kernel_route():
                fn_routes = FunctionInstaller(self.serve, by_site).install(self.model, installed, restore)
                if fn_routes:
                    tokens.append(sites._FN_ROUTES.set(fn_routes))
                    tokens.append(sites._FN_HOST.set(None))
            if self.steps is not None:
                root = self.model._module

                def count_step(mod: Any, args: Any, kwargs: Any) -> None:
                    if RUNNING_TRACE.get() is not self.call_dims:
                        return  # another thread's forward of the same model
                    self.step = self._calls
                    self._calls += 1

                self._calls = 0
                installed.append(root.register_forward_pre_hook(count_step, with_kwargs=True))
            tokens.append(RUNNING_TRACE.set(self.call_dims))
            self.grad_live = self.grad and grad
            torch._C._set_grad_enabled(self.grad_live)  # (torch.set_grad_enabled, without its object)
            if interrupts.pending():  # an interrupt while installing: raise it before the forward
                interrupts.deliver()
            self.output = self._forward()
        except BaseException:
            if plan_key is not None:
                installer.forget(plan_key)  # (a forward that raised may have left a wrapper's state half way)
            raise
        finally:
            _teardown(installed, restore, tokens, grad, modes)
        if self._late is not None:
            self._raise_late(*self._late)
        missing = [r for r in self._ordered if not r.done and r.owner is None]
        if derived:  # a derived value and its inputs point at each other: unlinked, they go with the last reference
            for r in ordered:
                r.owner = r.deps = None
        if missing:
            names = ", ".join(r.label + (f" (step {r.step})" if self.steps is not None else "") for r in missing)
            raise NotReached(f"the forward finished without computing {names}: "
                             "nothing in this call reaches that point (check the inputs, the block kind, the step)")

    def _raise_late(self, first: Request, later: Request) -> None:
        if self.fired:  # first's site fired after later's: the body asked in the wrong order
            raise OutOfOrderError(first.label, later.label)
        raise NotReached(f"{first.label} was never computed: its read point never fired in this forward, so "
                         f"{later.label}, asked for after it, could not be served in the body's order. Nothing in this "
                         "call reaches that point (check the inputs, the block kind, the step); in a spec of your own, "
                         "check the read point names a module or op the forward really calls")

    def _own_inputs(self) -> None:
        """The forward gets copies of the input tensors (the dict its call reads is this one), so that
        an edit of an input value, or of a value that is one (``layers[0].input`` is the caller's
        inputs_embeds), never writes into the caller's tensors. Only a trace that edits a value a
        module receives (``INPUT_SIDES``) copies: reads, and edits of what a module computed, do not."""
        inputs = self.inputs
        if isinstance(inputs, dict):
            for k, v in list(inputs.items()):
                if isinstance(v, torch.Tensor):
                    inputs[k] = v.clone()

    @interrupts.open_frame
    def _forward(self) -> Any:
        """The model's own forward (or generate): an interrupt here raises at once."""
        return self._run()


def _teardown(installed: list[Any], restore: list[Callable[[], None]], tokens: list[Token[Any]], grad: bool,
              modes: int) -> None:
    """Take away what a forward installed, whatever happened: every step runs even when another
    raised (the first error is raised after), each is removed from its list before it runs (so
    nothing is undone twice), and it runs inside a critical section (no interrupt lands in it)."""
    error: BaseException | None = None
    torch._C._set_grad_enabled(grad)
    # a scope's TorchFunctionMode left on the stack by an exception between its push and its with
    while torch._C._len_torch_function_stack() > modes and isinstance(
            torch._C._get_function_stack_at(torch._C._len_torch_function_stack() - 1), op_scopes.OpMode):
        torch._C._pop_torch_function_stack()
    while installed:
        handle = installed.pop()
        try:
            handle.remove()
        except BaseException as e:  # noqa: PERF203 (every step runs)
            error = error or e
    while restore:
        undo = restore.pop()
        try:
            undo()
        except BaseException as e:  # noqa: PERF203
            error = error or e
    while tokens:
        token = tokens.pop()
        try:
            token.var.reset(token)
        except BaseException as e:  # noqa: PERF203
            error = error or e
    if error is not None:
        raise error


def _show(sl: int | slice) -> str:
    if not isinstance(sl, slice):
        return str(sl)
    text = f"{'' if sl.start is None else sl.start}:{'' if sl.stop is None else sl.stop}"
    return text + (f":{sl.step}" if sl.step is not None else "")


class _Steps:
    """``tracer.iter[...]``: generation steps under ``model.generate``; in a trace, the tokens of a
    per-token value (a recurrent kernel's ``state`` under ``route_kernels``)."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer

    def __getitem__(self, sl: int | slice) -> Iterator[int]:
        total = self.tracer.steps
        per_call = total is None
        if per_call:
            total = self.tracer.calls
            if total is None:
                raise NnatlasError("tracer.iter walks generation steps (model.generate) or the tokens of a trace "
                                   "whose inputs have a known length")
        assert total is not None
        what = "tokens of this call" if per_call else "generation steps (max_new_tokens)"
        ends = (sl.start, sl.stop) if isinstance(sl, slice) else (sl,)
        if isinstance(sl, slice) and sl.step is not None and sl.step <= 0:
            raise InputError(f"tracer.iter[{_show(sl)}]: expected a positive step")
        if any(e is not None and not -total <= e <= total for e in ends) or (not isinstance(sl, slice) and sl == total):
            raise InputError(f"tracer.iter[{_show(sl)}]: there are {total} {what}: expected steps in 0..{total - 1}")
        steps = range(total)[sl] if isinstance(sl, slice) else [range(total)[sl]]
        if not steps:
            raise InputError(f"tracer.iter[{_show(sl)}] holds no step of the {total} {what}")
        return self._walk(list(steps), per_call)

    def _walk(self, steps: list[int], per_call: bool) -> Iterator[int]:
        try:
            for s in steps:
                if per_call:
                    self.tracer.current_call = s
                else:
                    self.tracer.current_step = s
                yield s
        finally:
            self.tracer.current_step = 0
            self.tracer.current_call = -1

