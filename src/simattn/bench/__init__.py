"""Benchmarks: attention kernels (``attention``), whole models (``model``) and the paper's figures (``paper``)."""
