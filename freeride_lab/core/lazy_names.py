"""A package's names loaded on first use (PEP 562), so that importing the package stays cheap.

>>> import sys, types
>>> pkg = types.ModuleType("pkg")
>>> pkg.__getattr__ = lazy_getattr("pkg", {"sqrt": "math"}, vars(pkg))
>>> pkg.sqrt(9.0), "sqrt" in vars(pkg)  # loaded once, then an ordinary attribute
(3.0, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(
    package: str, where: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``name`` from the module
    ``where[name]`` names on first use and keeps it in ``namespace`` (the package's
    ``globals()``), so the next lookup is an ordinary one.
    """

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
