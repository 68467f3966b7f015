"""Point-wise activation attention (sigmoid, ReLU) as flash-style Triton kernels: :mod:`.kernels` and :mod:`.launch`
(``activation_triton``)."""

from .. import entry_points

__getattr__ = entry_points(__name__, ("activation_triton",))
