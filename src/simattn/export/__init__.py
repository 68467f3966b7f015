"""The ``simattn export`` command: its options, the checks it runs on the written file (parity with PyTorch,
int8 accuracy, softmax latency) and its report. The formats themselves, their runtimes and the exp-op audit live in
:mod:`simattn.deploy`.

The runtimes' packages (the ``export``, ``edge``, ``openvino`` and ``tflite`` extras) are imported inside the
functions that need them, so importing this package stays cheap.
"""
from .architecture import attention_kind, model_stride, softmax_twin

__all__ = ["attention_kind", "model_stride", "softmax_twin"]
