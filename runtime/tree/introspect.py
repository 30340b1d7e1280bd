"""What tools ask of a wrapped model's standard-name tree, as functions: a host's native module, label, parent,
standard children and the specs that apply to it.

These are functions, not attributes of a host, because a host's attributes are its family's standard
names (a value could be called ``label`` or ``parent``). The compiler's tree check uses them to hold a
spec against the module trees of its tiny configs and checkpoints, without reaching into the runtime's
own members.

    model = nnatlas.wrap(hf_model)
    attn = introspect.child(model.layers[0], "self_attn")
    introspect.label(attn), introspect.native(attn), introspect.parent(attn) is model.layers[0]
"""

from __future__ import annotations

import torch

from ..spec import HostSpec
from .hosts import Host, HostList, resolve_native

__all__ = ["child", "child_names", "label", "native", "parent", "resolve_native", "specs"]

Node = Host | HostList  # a host, or a list of hosts (``model.layers``)


def native(node: Node) -> torch.nn.Module:
    """The transformers module under this standard name (a ModuleList for a list of hosts)."""
    return node._module


def label(node: Node) -> str:
    """Its standard path on this model (``layers[3].self_attn``; ``""`` for the model itself)."""
    return node._label


def parent(node: Node) -> Host | None:
    """The host it was reached from (each block's is the host holding the list); None for the model."""
    found: Host | None = node.__dict__.get("_parent")
    return found


def child(node: Node, name: str) -> Host | HostList | None:
    """Its child ``name`` (a standard name the family renames, or a native child), or None; of a list of
    hosts, the one a number names (``input_layernorm.0``: a read into a list child), or None."""
    if isinstance(node, HostList):
        return node[int(name)] if name.isdigit() and int(name) < len(node) else None
    return node._child(name)


def child_names(node: Node) -> list[str]:
    """The names of its children: the family's standard names for children at this path, then the
    native module's own children."""
    if isinstance(node, HostList):
        return [str(k) for k in range(len(node))]
    pattern = node._pattern
    prefix = "" if pattern == "model" else f"{pattern}."
    std = [k[len(prefix):] for k in node._model._family.rename if k.startswith(prefix) and "." not in k[len(prefix):]]
    return list(dict.fromkeys([*std, *node._module._modules]))


def specs(host: Host) -> list[HostSpec]:
    """The host specs that apply to this host on this load (on a hybrid stack, its block's kind)."""
    return host._specs()
