"""Linear attention with a d×dv state as fused Triton kernels: :mod:`.kernels` (the skeleton, each kind's prologue
and epilogue) and :mod:`.launch` (plans, autograd, custom ops, ``sima_triton`` and ``linear_triton``)."""

from .. import entry_points

__getattr__ = entry_points(__name__, ("sima_triton", "linear_triton"))
