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

from collections.abc import Callable, Mapping
from contextvars import Token
from operator import attrgetter
from typing import Any

import torch

from ..errors import InputError, NnatlasError
from . import interrupts, op_scopes, replay, sites, unserved
from .computed import serve_ready
from .function_sites import FunctionInstaller
from .installers import SiteInstaller, installer_of
from .placeholders import Placeholder, abandon
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
    fill,
    save_with_grad,
)
from .steps import Steps

_SEQ = attrgetter("seq")  # (sorted's key in C: no Python call per request)
_DONE = attrgetter("done")
_len_modes = torch._C._len_torch_function_stack
_set_grad = torch._C._set_grad_enabled  # (torch.set_grad_enabled, without its object)
_grad_enabled = torch._C.is_grad_enabled
_Tensor = torch.Tensor
_set_running = RUNNING_TRACE.set
_new = object.__new__

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
    strict = True  # order="strict": requests are served in body order
    grad = False  # trace(grad=True) asked
    steps: int | None = None  # generation steps (model.generate)
    _tokens: int | None = None  # the tokens of this call, when given or found (``calls``)
    _call: Callable[..., Any] | None = None  # what a trace calls with its inputs as keywords (else ``_run()``)
    _ordered: list[Request] | tuple[()] = ()  # the requests in body order (made when the block ends)
    # the body's saves recorded without a request (``Value.save``, while it has asked nothing else): each one's
    # target, then its holder; made into requests when the block ends unless the trace is replayed (``replay``)
    _quick: list[Any]
    _quick_made = 0  # how many of the requests were made of those
    _replay: replay.Replay | None = None  # what a replayed trace serves (``replay.execute``)
    _pending: list[Any]  # the holders of a replayed trace not served yet (None: served)
    _state: set[int] | None = None  # the storages of the model's weights (made at the first in-place edit)
    # (first, later): the first request still waiting when a later one's site fired; the forward then runs
    # on, serving nothing, counting only whether ``first``'s site fires: "computed later" (OutOfOrderError)
    # or "never fired" (NotReached)
    _late: tuple[Request, Request] | None = None
    _lock_held = False
    # every request a plain save (no copy, the site's first call) of a site of its own, in a trace that
    # reused its plan (``_execute``): ``serve`` takes its short path
    _saves = False
    _guarded = False  # whether __enter__ counted in ``interrupts`` (the main thread's)
    grad_live = False  # whether this forward keeps autograd (trace(grad=True), with grad mode on)
    edits = False  # whether the body edits an input-side value (the forward then gets copies of the inputs)
    # made on first use while recording (most traces ask no load condition)
    conditions: dict[tuple[int, int], bool] | None = None  # load conditions asked while recording
    available: set[tuple[int, int, int]] | None = None  # (read point, condition, config) a save found served
    # the body's saves of tensors computed from values, not served yet (nnatlas.trace.computed): (request, expression)
    computed: list[tuple[Request, Expr]] | None = None
    # made when the block ends (``_execute``; a replayed trace makes them only where it goes the general way)
    by_site: dict[SiteKey, list[Request]]  # the requests by site
    fired: dict[int | tuple[int, int], int]  # times each site fired (by id of its list in by_site, and step)
    _run: Callable[[], Any] | None = None  # the forward (or generate) where no ``_call`` is given

    def __init__(self, model: WrappedModel, run: Callable[[], Any] | None, order: str = "strict", grad: bool = False,
                 steps: int | None = None, calls: int | None = None, inputs: Mapping[str, Any] | None = None,
                 call: Callable[..., Any] | None = None):
        """``run()`` is the forward (or generate); or, with ``run=None``, ``call(**inputs)`` is (a trace's
        forward: the inputs dict is the one the forward reads, made once). What is not given stays at the
        class's default (an attribute set only where it differs: a trace is made once per forward)."""
        if order != "strict":
            if order != "any":
                raise ValueError("order is 'strict' or 'any'")
            self.strict = False
        self.model = model
        if call is None:
            self._run = run
        else:
            self._call = call
        if grad or steps is not None or calls is not None:  # (none of them in a plain trace)
            if grad:
                self.grad = grad
            if steps is not None:
                self.steps = steps
            if calls is not None:
                self._tokens = calls
        self.inputs: Mapping[str, Any] = inputs or {}
        self.requests: list[Request] = []
        self._quick = []
        self.call_dims: dict[int, tuple[int, int]] = {}

    @classmethod
    def _plain(cls, model: WrappedModel, inputs: Mapping[str, Any], call: Callable[..., Any]) -> Tracer:
        """``Tracer(model, None, inputs=inputs, call=call)``, made without ``__init__``'s choices: a trace of the
        forward in body order, without grad (``model.trace``'s common case)."""
        self = _new(cls)
        self.model, self._call, self.inputs, self.requests, self._quick, self.call_dims = model, call, inputs, [], [], {}
        return self

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
    def iter(self) -> Steps:
        """Generation steps: ``for step in tracer.iter[0:3]:`` records the body once per step."""
        return Steps(self)

    # -- the context manager --
    # Opening and closing are critical sections (``interrupts``): a signal landing in them, or in
    # what they call, waits until they end; one landing in the forward (``_forward``) or the body
    # raises at once, and the ``finally`` of ``_execute`` / ``__exit__`` takes everything away.
    @interrupts.critical
    def __enter__(self) -> Tracer:
        self._guarded = interrupts.enter()
        try:
            d = self.model.__dict__  # (the model's own attributes: AtlasModel's __getattr__ is for its names)
            lock = d["_lock"]
            if not lock.acquire(False):
                while not lock.acquire(timeout=0.05):  # another thread traces this model: wait, interruptibly
                    if interrupts.pending():
                        interrupts.deliver()
            self._lock_held = True
            if d["_tracer"] is not None:
                raise NnatlasError("a trace of this model is already open; traces do not nest")
            d["_tracer"] = self
            if interrupts._pending:  # an interrupt while opening: close again, then raise it
                interrupts.deliver()
        except BaseException:
            self._close()
            raise
        return self

    @interrupts.critical
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        d = self.model.__dict__
        try:
            if d["_tracer"] is self:
                d["_tracer"] = None
                if exc_type is None:
                    self._execute()
                else:
                    abandon([*self._quick[1::2], *(r.payload for r in self.requests)])
        finally:
            self._close()

    @interrupts.critical
    def _close(self) -> None:
        """Clear the model's tracer, release its lock and the signal handlers (idempotent)."""
        try:
            d = self.model.__dict__
            if d["_tracer"] is self:
                d["_tracer"] = None
            if self._lock_held:
                self._lock_held = False
                d["_lock"].release()
        finally:
            guarded, self._guarded = self._guarded, False
            interrupts.leave(guarded)

    # -- serving (the forward) --
    def serve(self, key: SiteKey, payload: Any) -> Any:
        reqs = self.by_site.get(key)
        if reqs is None:
            return payload
        if self._saves:  # the short path (a trace whose every request is a plain save of a site of its own)
            r = reqs[0]
            if r.done:
                return payload  # (a later call of the site: the save is its first call's)
            if self.strict:
                i = self._cursor  # (the first request not served yet: the one served last is before it)
                first = self._ordered[i]
                if first is not r:
                    return self._out_of_order(first, r, payload)
                self._cursor = i + 1
            get = r.target.get  # type: ignore[union-attr]  # (every request in by_site has a target)
            value = payload if get is _same else get(payload)
            holder = r.payload
            if type(holder) is _Tensor and isinstance(value, _Tensor):
                holder.data = value
            else:
                fill(holder, value, r.label)
            r.done = True
            return payload
        step = self.step
        fired = id(reqs) if step == 0 else (id(reqs), step)  # (a site's list of requests: one per site for the trace)
        n = self.fired.get(fired, 0)
        self.fired[fired] = n + 1
        for r in reqs:
            call = r.call
            if r.step != step or (call != -1 and (r.done or call != n)):
                continue
            if r.ordered and self.strict:  # the first request not served yet must be this one (_first_undone, inlined)
                ordered = self._ordered
                i = self._cursor
                if i < len(ordered) and ordered[i] is r:  # served in body order: the cursor moves on past it
                    self._cursor = i + 1
                else:
                    end = len(ordered)
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
                elif type(holder) is _Tensor and isinstance(value, _Tensor):
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
        self._saves = False
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

    def _finish_computing(self, r: Request, payload: Any) -> Any:
        """``_finish`` in a trace whose body saved a tensor computed from values (``_execute`` puts it in place):
        each such save is served once the values it reads are (nnatlas.trace.computed); other traces never run it."""
        payload = Tracer._finish(self, r, payload)
        if self.computed is not None:
            serve_ready(self)
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

    _serve_replay = replay.serve  # (what a replayed trace's wrappers call: a bound method)

    def _materialize(self) -> None:
        """The saves recorded without a request (``_quick``) as the requests they stand for: the first in body
        order (none was recorded after another request), each a plain save of its target's first call."""
        quick = self._quick
        made = [Request(j, t.label, "save", t, h, 0, 0) for j, (t, h) in enumerate(zip(quick[::2], quick[1::2], strict=True))]
        self.requests[:0] = made
        self._quick_made = len(made)

    def _execute(self) -> None:
        if self._quick:  # saves recorded without requests: replayed, if an earlier trace recorded the same (``replay``)
            if replay.execute(self):
                return
            self._materialize()
        ordered = self._ordered = sorted(self.requests, key=_SEQ)
        by_site = self.by_site = {}
        self.fired = {}
        special = False  # a derived value, or a target with more than a site (Target.special)
        saves = True  # every request a plain save of a site of its own (``_saves``)
        for r in ordered:
            holder = r.payload
            if type(holder) is Placeholder:  # the body's placeholder becomes a plain tensor, to be filled
                holder.__dict__.pop("_nnatlas_label", None)
                holder.__class__ = torch.Tensor  # type: ignore[assignment]  # (the body's object, made plain)
            t = r.target
            if t is None or t.special:
                special = True
                if t is None:
                    continue
            if r.action != "save" or t.copy or r.call:
                saves = False
            reqs = by_site.get(t.site)
            if reqs is None:
                by_site[t.site] = [r]
            else:
                reqs.append(r)
                saves = False
        model = self.model
        installer = model.__dict__.get("_site_installer") or installer_of(model)
        # the common trace (reads and edits of sites laid out as an earlier trace's, whose plain plan is still
        # valid): put that plan's wrappers on, run the forward, take them off; anything more, _execute_general
        if (special or not ordered or self.edits or self.grad or self.steps is not None or self.computed is not None
                or sites._KERNEL_ROUTES.get() or "_kernels" in model.__dict__):
            reused = None
        else:
            reused = installer.reuse(by_site, self.serve, self.call_dims)
        if reused is None:
            self._execute_general(ordered, special, installer)
            return
        plan = reused[1]
        if saves:
            self._saves = True
            if self._quick_made == len(ordered):  # (the next trace that records the same saves replays this one)
                installer.remember(replay.Replay([r.target for r in ordered], *reused))  # type: ignore[misc]
        grad = _grad_enabled()
        token = _set_running(self.call_dims)
        try:
            plan.put_on()
            _set_grad(False)  # (grad_live: no trace(grad=True) here)
            if interrupts._pending:  # an interrupt while installing: raise it before the forward
                interrupts.deliver()
            self.output = self._forward()
        except BaseException:
            installer.forget(reused[0])  # (a forward that raised may have left a wrapper's state half way)
            raise
        finally:  # (_teardown's steps, none of which raises)
            _set_grad(grad)
            installer.off(plan)
            RUNNING_TRACE.reset(token)
        if self._late is not None or not all(map(_DONE, ordered)):  # (no derived value here: no request has an owner)
            unserved.served(self, ordered, False)

    def _execute_general(self, ordered: list[Request], special: bool, installer: SiteInstaller) -> None:
        """``_execute`` for any trace: call conditions, module-level functions, view dims, derived and computed
        values, edits of inputs, generation steps, grad, op scopes and interface routes."""
        by_site = self.by_site
        conditional = functions = derived = False
        dims: tuple[torch.nn.Module, ...] = ()  # the modules whose calls give views their dims
        if special:
            for r in ordered:
                t = r.target
                if t is None:
                    derived = True
                    continue
                if t.reached is not None:
                    conditional = True
                if t.fn_site:
                    functions = True
                if t.dims_module is not None and t.dims_module not in dims:
                    dims = (*dims, t.dims_module)
        if conditional:
            unserved.check_reached(self.inputs, [r for r in ordered if r.target is not None])
        if self.edits:
            self._own_inputs()
        installed: list[Any] = []
        restore: list[Callable[[], None]] = []
        tokens: list[Token[Any]] = []
        model = self.model
        grad = _grad_enabled()
        modes = -1  # the torch function modes on the stack before the forward, where its op scopes may push some
        plan_key = None
        if self.computed is not None:
            self._finish = self._finish_computing  # type: ignore[method-assign]
        try:
            if ordered:  # (an empty trace installs nothing)
                plan_key, plan = installer.install(model._module, by_site, self.serve, self.call_dims, dims,
                                                   installed, restore)
                if plan.scoped:
                    modes = _len_modes()
                if plan.routes:
                    tokens.append(sites._ROUTES.set(plan.routes))
            # (the kernel routes are asked only when some are set: route_kernels, model.kernels)
            if functions or ((sites._KERNEL_ROUTES.get() or "_kernels" in model.__dict__) and model._kernel_route()):
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
            if self.grad:
                self.grad_live = grad
            _set_grad(self.grad_live)
            if interrupts._pending:  # an interrupt while installing: raise it before the forward
                interrupts.deliver()
            self.output = self._forward()
        except BaseException:
            if plan_key is not None:
                installer.forget(plan_key)  # (a forward that raised may have left a wrapper's state half way)
            raise
        finally:
            self.__dict__.pop("_finish", None)  # (the bound method held on the instance: no cycle left)
            _teardown(installed, restore, tokens, grad, modes)
        unserved.served(self, ordered, derived)

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
        call = self._call
        if call is not None:
            return call(**self.inputs)
        return self._run()  # type: ignore[misc]  # (one of the two is given)


def _teardown(installed: list[Any], restore: list[Callable[[], None]], tokens: list[Token[Any]], grad: bool,
              modes: int) -> None:
    """Take away what a forward installed, whatever happened: every step runs even when another
    raised (the first error is raised after), each is removed from its list before it runs (so
    nothing is undone twice), and it runs inside a critical section (no interrupt lands in it)."""
    error: BaseException | None = None
    _set_grad(grad)
    # a scope's TorchFunctionMode left on the stack by an exception between its push and its with (``modes``:
    # the stack's height before the forward, -1 where no op scope was installed, so that none was pushed)
    while modes >= 0 and _len_modes() > modes and isinstance(torch._C._get_function_stack_at(_len_modes() - 1),
                                                             op_scopes.OpMode):
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
