"""The kernels of the attention kinds, one folder per family, and the host every Triton family shares.

* :mod:`~simattn.kernels.linear`: linear attention with a d×dv state, φ(q)(φ(k)ᵀv): SimA, ELU, XNorm, SLAB, FLatten,
  InLine and PolaFormer, one skeleton with each kind's prologue and epilogue under named flags;
* :mod:`~simattn.kernels.pointwise`: point-wise activation attention (sigmoid, ReLU), flash-style;
* :mod:`~simattn.kernels.agent`: Agent attention's two softmax steps, the agents held per program;
* :mod:`~simattn.kernels.cpu`: SimA's compiled CPU kernel (C++, built once per machine).

Each Triton family has ``kernels.py`` (the ``@triton.jit`` code) and ``launch.py`` (plans, autograd, custom ops and
its entry points); :mod:`~simattn.kernels.host` is what they share on the host (plan cache, launch modes, direct
launches, ``dry_run``, ``hopper_stand_in``, the eager-or-custom-op branch, ``tuned``) and :mod:`~simattn.kernels.tiles`
on the device. The kinds (:mod:`simattn.attention`) call the entry points; nothing here imports them. Importing this
package imports neither Triton nor a kernel: CPU calls never load them.
"""

import sys
from typing import Any, Callable, Tuple

__all__ = ["entry_points"]


def entry_points(package: str, names: Tuple[str, ...]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of a kernel family ``package``: its entry points ``names``, imported from its
    ``launch`` module at the first lookup and bound in the package, so that a kind calls
    ``family.entry(...)`` with no import statement per call (one costs the host about a microsecond) and importing
    the package still loads neither Triton nor a kernel."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        from importlib import import_module
        value = getattr(import_module(package + ".launch"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
