"""Deprecated spellings of public arguments and attributes, kept working for one release.

Each use warns with a ``FutureWarning`` that names the replacement (docs/architecture.md, "Names").
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable, Dict, Sequence

import torch

_REMOVAL = "is deprecated and will be removed in the next release"


def _warn(message: str) -> None:
    # stacklevel 3: the warning points at the caller of the decorated function / attribute. Not while
    # torch.compile traces (Dynamo cannot trace warnings.warn: fullgraph=True would fail); eager calls warn.
    if not torch.compiler.is_compiling():
        warnings.warn(message, FutureWarning, stacklevel=3)


def deprecated_arguments(*, renamed: Dict[str, str] = None, keyword_only: Sequence[str] = ()) -> Callable:
    """Decorator keeping old calls of ``fn`` working, with a warning each:

    * ``renamed`` maps an old keyword to its new name (giving both is a ``TypeError``);
    * ``keyword_only`` names the arguments that became keyword-only, in their old positional order
      right after ``fn``'s positional parameters: extra positional values are taken as them."""
    renamed = renamed or {}

    def decorate(fn: Callable) -> Callable:
        what = fn.__qualname__.replace(".__init__", "")
        params = inspect.signature(fn).parameters.values()
        positional = sum(p.kind == p.POSITIONAL_OR_KEYWORD for p in params)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{what}() got both {old!r} (deprecated) and {new!r}")
                    _warn(f"{what}: argument {old!r} {_REMOVAL}, use {new!r}")
                    kwargs[new] = kwargs.pop(old)
            extra = args[positional:]
            if len(extra) > len(keyword_only):
                raise TypeError(f"{what}() takes at most {positional + len(keyword_only)} positional "
                                f"arguments (the deprecated ones included), got {len(args)}")
            for name, value in zip(keyword_only, extra):
                if name in kwargs:
                    raise TypeError(f"{what}() got multiple values for argument {name!r}")
                _warn(f"{what}: passing {name!r} positionally {_REMOVAL}, use {name}=...")
                kwargs[name] = value
            return fn(*args[:positional], **kwargs)
        return call
    return decorate


class renamed_attribute:
    """Class attribute ``old = renamed_attribute("new")``: reading ``obj.old`` reads ``obj.new``, with a
    warning."""

    def __init__(self, new: str):
        self.new = new

    def __set_name__(self, owner, name: str) -> None:
        self.old = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        _warn(f"{type(obj).__name__}: attribute {self.old!r} {_REMOVAL}, use {self.new!r}")
        return getattr(obj, self.new)
