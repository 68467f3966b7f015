"""Agent attention's two steps as Triton kernels: :mod:`.kernels` and :mod:`.launch` (``agent_gather_triton``,
``agent_broadcast_triton``)."""

from .. import entry_points

__getattr__ = entry_points(__name__, ("agent_gather_triton", "agent_broadcast_triton"))
