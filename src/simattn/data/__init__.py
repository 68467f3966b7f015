"""Datasets: the embedded default (scikit-learn's handwritten digits) and readers for standard on-disk layouts."""
from .digits import DigitsDataset, digits_tensors

__all__ = ["DigitsDataset", "digits_tensors"]
