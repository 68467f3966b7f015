"""``simattn convert``: turn a pretrained softmax ViT into a SimA (or any softmax-free) ViT.

Python use::

    from simattn.convert import convert, load_convert_recipe
    cfg = load_convert_recipe("convert_digits", {"output": "runs/convert", "epochs": 2})
    results = convert(cfg, "teacher/final.safetensors")
    results["final"]["top1"]
"""
from .config import ConvertConfig, ConvertOptions, load_convert_recipe
from .run import convert
from .student import build_student, check_kind, convertible_kinds, load_teacher

__all__ = ["ConvertConfig", "ConvertOptions", "load_convert_recipe", "convert", "build_student", "check_kind", "convertible_kinds",
           "load_teacher"]
