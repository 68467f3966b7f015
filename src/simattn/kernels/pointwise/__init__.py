"""Point-wise activation attention (sigmoid, ReLU) as flash-style Triton kernels: :mod:`.kernels` and :mod:`.launch`
(``activation_triton``)."""
