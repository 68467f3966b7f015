"""Agent attention's two steps as Triton kernels: :mod:`.kernels` and :mod:`.launch` (``agent_gather_triton``,
``agent_broadcast_triton``)."""
