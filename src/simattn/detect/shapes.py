"""A tiny synthetic COCO-layout instance dataset (squares, disks, triangles on noise) for smoke runs on a CPU.

Writes ``<root>/<split>/*.png`` and ``<root>/annotations/instances_<split>.json``: squares carry compressed-RLE
masks, disks and triangles polygon masks, so both COCO mask encodings are exercised.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Tuple

import numpy as np

from ..utils.io import atomic_path, atomic_write_json

__all__ = ["SHAPE_CATEGORIES", "DEFAULT_SHAPES_ROOT", "make_shapes_dataset"]

#: where ``simattn detect shapes`` writes by default and ``configs/detect_shapes_cpu.yaml`` reads
DEFAULT_SHAPES_ROOT = "data/shapes"

SHAPE_CATEGORIES = ({"id": 1, "name": "square"}, {"id": 2, "name": "disk"}, {"id": 3, "name": "triangle"})


def _polygon(kind: str, cx: float, cy: float, r: float) -> list:
    if kind == "disk":
        angles = np.linspace(0, 2 * math.pi, 24, endpoint=False)
    else:  # triangle, pointing up
        angles = np.array([-math.pi / 2, math.pi / 6, 5 * math.pi / 6])
    return [float(v) for a in angles for v in (cx + r * math.cos(a), cy + r * math.sin(a))]


def make_shapes_dataset(root: str | Path, split: str = "train", num_images: int = 8, image_size: int = 128,
                        max_objects: int = 3, seed: int = 0) -> Tuple[Path, Path]:
    """Generate one split; returns (images folder, annotation file). Deterministic for a given seed."""
    from PIL import Image, ImageDraw
    from pycocotools import mask as mask_utils
    if num_images < 1 or image_size < 32 or max_objects < 1:
        raise ValueError("make_shapes_dataset: need num_images >= 1, image_size >= 32, max_objects >= 1")
    from ..utils.memory import check_memory
    # an RGB image, its per-object masks and their RLE encodings
    check_memory(float(image_size) ** 2 * (3 + 2 * max_objects), f"a {image_size}x{image_size} shapes image")
    root = Path(root)
    images_dir = root / split
    images_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        pixels = rng.integers(0, 60, (image_size, image_size, 3), dtype=np.uint8)  # dark noise background
        canvas = Image.fromarray(pixels)
        draw = ImageDraw.Draw(canvas)
        taken: list = []
        for _ in range(int(rng.integers(1, max_objects + 1))):
            r = float(rng.uniform(0.1, 0.2) * image_size)
            for _attempt in range(20):  # place without overlapping earlier shapes
                cx, cy = rng.uniform(r + 1, image_size - r - 1, size=2)
                if all(math.hypot(cx - x, cy - y) > r + rr + 2 for x, y, rr in taken):
                    break
            else:
                continue
            taken.append((cx, cy, r))
            cat = SHAPE_CATEGORIES[int(rng.integers(0, len(SHAPE_CATEGORIES)))]
            color = tuple(int(c) for c in rng.integers(120, 256, size=3))
            ann: Dict = {"id": len(annotations) + 1, "image_id": image_id, "category_id": cat["id"], "iscrowd": 0}
            if cat["name"] == "square":
                x0, y0, x1, y1 = (int(round(v)) for v in (cx - r, cy - r, cx + r, cy + r))
                draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=color)
                binary = np.zeros((image_size, image_size), np.uint8)
                binary[y0:y1, x0:x1] = 1
                rle = mask_utils.encode(np.asfortranarray(binary))
                ann["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
            else:
                poly = _polygon(cat["name"], cx, cy, r)
                draw.polygon(poly, fill=color)
                rle = mask_utils.merge(mask_utils.frPyObjects([poly], image_size, image_size))
                ann["segmentation"] = [poly]
            ann["area"] = float(mask_utils.area(rle))
            ann["bbox"] = [float(v) for v in mask_utils.toBbox(rle)]
            annotations.append(ann)
        file_name = f"{image_id:06d}.png"
        with atomic_path(images_dir / file_name) as tmp:
            canvas.save(tmp, format="PNG")
        images.append({"id": image_id, "file_name": file_name, "width": image_size, "height": image_size})
    ann_file = root / "annotations" / f"instances_{split}.json"
    atomic_write_json({"images": images, "annotations": annotations, "categories": list(SHAPE_CATEGORIES)}, ann_file)
    return images_dir, ann_file
