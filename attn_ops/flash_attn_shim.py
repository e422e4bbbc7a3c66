"""Opt-in shim: ``import flash_attn`` (FlashAttention 2) and ``import flash_attn_interface`` (FlashAttention 3)
resolve to attn_ops, so code written for FlashAttention runs unchanged, on CPU as well as CUDA.

Enable it in code, before the third-party code imports FlashAttention (before ``import transformers``, which
looks the packages up when it is imported)::

    import attn_ops.flash_attn_shim; attn_ops.flash_attn_shim.install()

or run a program unchanged with it: ``python -m attn_ops.flash_attn_shim program.py [args]`` (or
``python -m attn_ops.flash_attn_shim -m package.module [args]``).

Modules served (each a module of its own whose names are attn_ops' functions):

=====================================  ============================================
``flash_attn``                         attn_ops.flash_attn_interface's functions, ``__version__``
``flash_attn.flash_attn_interface``    attn_ops.flash_attn_interface (FA2)
``flash_attn.bert_padding``            attn_ops.flash_attn_padding
``flash_attn.layers.rotary``           attn_ops.flash_attn_rotary
``flash_attn_interface``               attn_ops.flash_attn3_interface (FA3)
=====================================  ============================================

Packages that check the *installed distributions* rather than importing (transformers'
``is_flash_attn_2_available`` reads ``importlib.metadata``) also see two: ``flash-attn`` (version
:data:`FLASH_ATTN_VERSION`, the FA2 release whose signatures attn_ops.flash_attn_interface matches) and
``flash-attn-3`` (top-level module ``flash_attn_interface``). Nothing is written to disk: an import hook on
``sys.meta_path`` answers both the imports and the metadata queries, for this process only.
"""

import importlib.abc
import importlib.machinery
import importlib.metadata
import runpy
import sys
from typing import Dict, Optional, Tuple

__all__ = ["FLASH_ATTN_VERSION", "install", "installed", "uninstall"]

#: The FlashAttention 2 release whose function signatures attn_ops.flash_attn_interface reproduces.
FLASH_ATTN_VERSION = "2.8.4"
#: FlashAttention 3 (hopper) beta release number its interface module is distributed under.
FLASH_ATTN_3_VERSION = "3.0.0b1"

# module name -> (attn_ops module it serves, whether it is a package)
_MODULES: Dict[str, Tuple[Optional[str], bool]] = {
    "flash_attn": ("attn_ops.flash_attn_interface", True),
    "flash_attn.flash_attn_interface": ("attn_ops.flash_attn_interface", False),
    "flash_attn.bert_padding": ("attn_ops.flash_attn_padding", False),
    "flash_attn.layers": (None, True),
    "flash_attn.layers.rotary": ("attn_ops.flash_attn_rotary", False),
    "flash_attn_interface": ("attn_ops.flash_attn3_interface", False),
}
# distribution name -> (version, top-level module)
_DISTRIBUTIONS = {"flash-attn": (FLASH_ATTN_VERSION, "flash_attn"),
                  "flash-attn-3": (FLASH_ATTN_3_VERSION, "flash_attn_interface")}


class _Distribution(importlib.metadata.Distribution):
    """Metadata of a distribution that exists only in this process (no files)."""

    def __init__(self, name: str, version: str, top_level: str):
        self._files = {"METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                       "top_level.txt": f"{top_level}\n"}

    def read_text(self, filename):
        return self._files.get(filename)

    def locate_file(self, path):
        raise FileNotFoundError(f"attn_ops.flash_attn_shim: the shimmed distributions have no files ({path})")


class _Loader(importlib.abc.Loader):
    """Builds each served module: a new module holding the public names of the attn_ops module it serves."""

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        target, _ = _MODULES[module.__name__]
        if target is None:
            return
        source = importlib.import_module(target)
        module.__doc__ = f"attn_ops shim for FlashAttention's {module.__name__}: {source.__name__}."
        for name in source.__all__:
            setattr(module, name, getattr(source, name))
        module.__all__ = list(source.__all__)
        if module.__name__ == "flash_attn":
            module.__version__ = FLASH_ATTN_VERSION


class _Finder(importlib.abc.MetaPathFinder):
    """Resolves the served module names and the shimmed distributions; consulted before every other finder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _LOADER, is_package=_MODULES[fullname][1])

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        wanted = context.name

        def norm(n):
            return n.lower().replace("_", "-")
        return iter([_Distribution(name, version, top) for name, (version, top) in _DISTRIBUTIONS.items()
                     if wanted is None or norm(wanted) == name])


_LOADER = _Loader()
_FINDER = _Finder()


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _FINDER in sys.meta_path


def install() -> None:
    """Serve ``flash_attn`` and ``flash_attn_interface`` from attn_ops in this process (idempotent).

    Raises ``RuntimeError`` if a real FlashAttention module was already imported: code holding it would mix
    the two.
    """
    if installed():
        return
    loaded = [name for name in _MODULES if name in sys.modules]
    if loaded:
        raise RuntimeError(f"attn_ops.flash_attn_shim.install(): {', '.join(loaded)} already imported from "
                           f"{getattr(sys.modules[loaded[0]], '__file__', None)}; install the shim before "
                           f"anything imports FlashAttention")
    sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Undo :func:`install`: the served modules leave ``sys.modules`` and the names resolve as before."""
    if installed():
        sys.meta_path.remove(_FINDER)
    for name in _MODULES:
        module = sys.modules.get(name)
        if module is not None and isinstance(getattr(module, "__loader__", None), _Loader):
            del sys.modules[name]


def _main(argv) -> None:
    """``python -m attn_ops.flash_attn_shim program.py [args]`` / ``-m module [args]``."""
    if not argv or argv[0] == "-m" and len(argv) < 2:
        raise SystemExit("usage: python -m attn_ops.flash_attn_shim (program.py | -m module) [args...]")
    install()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    _main(sys.argv[1:])
