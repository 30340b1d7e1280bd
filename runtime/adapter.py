"""The data model under its old module name: ``nnatlas.spec`` holds it (one model for the compiler and the
runtime). Kept only while the tracer's modules still import it from here."""

from __future__ import annotations

from .spec import Condition, Family, FunctionGroup, HostSpec, Identity, Layout, ReadPoint, ValueSpec, ViewOp

__all__ = ["Condition", "Family", "FunctionGroup", "HostSpec", "Identity", "Layout", "ReadPoint", "ValueSpec", "ViewOp"]
