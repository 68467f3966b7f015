"""Small webdataset shards for the reader tests, written by ``simattn data pack``'s writer
(:func:`simattn.data.pack.write_samples`): ``SPLIT-%06d.tar`` with samples ``%08d`` (index in the split) holding
``png`` + ``cls`` (or ``mask.png``), and timm's ``_info.json``; :func:`write_broken_split` writes by hand the shards
the writer refuses."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


def png_bytes(array: np.ndarray) -> bytes:
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(array, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size, member.mtime, member.mode = len(data), 0, 0o444
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    tar.addfile(member, io.BytesIO(data))


def write_split(folder: Path, split: str, samples: Sequence[Dict[str, bytes]], shard_samples: int,
                classes: Sequence[str], task: str = "classification", extra: Optional[dict] = None,
                name: str = "test") -> List[int]:
    """Pack ``samples`` (each a dict of member extension -> bytes, the image first) of ``split`` into shards of
    ``shard_samples`` with ``simattn data pack``'s writer, adding the split to ``folder/_info.json``; returns the shard
    lengths."""
    from simattn.data.pack import write_samples
    write_samples([list(sample.items()) for sample in samples], split, folder, name=name, classes=classes, task=task,
                  extra=extra, shard_samples=shard_samples)
    return json.loads((folder / "_info.json").read_text())["splits"][split]["shard_lengths"]


def write_broken_split(folder: Path, split: str, samples: Sequence[Dict[str, bytes]], shard_samples: int,
                       classes: Sequence[str]) -> List[int]:
    """The same layout written by hand, for samples the pack writer refuses (no label, a label outside the
    classes): shards that are broken on purpose."""
    folder.mkdir(parents=True, exist_ok=True)
    names, lengths = [], []
    for shard, start in enumerate(range(0, len(samples), shard_samples)):
        name = f"{split}-{shard:06d}.tar"
        chunk = samples[start:start + shard_samples]
        with tarfile.open(folder / name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, sample in enumerate(chunk, start=start):
                for ext, data in sample.items():
                    _add(tar, f"{i:08d}.{ext}", data)
        names.append(name)
        lengths.append(len(chunk))
    info_path = folder / "_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {
        "name": "test", "task": "classification", "classes": list(classes), "num_classes": len(classes),
        "splits": {}}
    info["splits"][split] = {"name": split, "num_samples": len(samples), "filenames": names,
                             "shard_lengths": lengths}
    info_path.write_text(json.dumps(info))
    return lengths


def digits_samples(split: str, limit: Optional[int] = None) -> Tuple[List[Dict[str, bytes]], List[Tuple[bytes, int]]]:
    """The embedded digits of ``split`` as shard samples (grey PNG + label), and (pixels, label) of each."""
    from simattn.data.digits import DigitsDataset
    ds = DigitsDataset(split)
    n = len(ds) if limit is None else min(limit, len(ds))
    samples = [{"png": png_bytes(ds.images[i]), "cls": str(int(ds.targets[i])).encode()} for i in range(n)]
    return samples, [(ds.images[i].tobytes(), int(ds.targets[i])) for i in range(n)]


def write_digits(folder: Path, shard_samples: int = 200, limit: Optional[int] = None) -> Path:
    """The digits' train and val splits packed into ``folder``."""
    from simattn.data.digits import DIGITS_CLASSES
    for split in ("train", "val"):
        write_split(folder, split, digits_samples(split, limit)[0], shard_samples, DIGITS_CLASSES, name="digits")
    return folder


def write_numbered(folder: Path, split: str, lengths: Sequence[int], classes: int = 2) -> None:
    """Shards of tiny images whose label is their sample index modulo ``classes`` (for counting who saw what):
    ``lengths`` are the shards' sizes, all equal but a smaller last one."""
    assert all(n == lengths[0] for n in lengths[:-1]) and 0 < lengths[-1] <= lengths[0], lengths
    samples = [{"png": png_bytes(np.full((4, 4), i % 256, np.uint8)), "cls": str(i % classes).encode()}
               for i in range(sum(lengths))]
    write_split(folder, split, samples, lengths[0], [str(c) for c in range(classes)], name="numbered")
