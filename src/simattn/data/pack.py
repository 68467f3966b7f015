"""``simattn data pack``: any dataset simattn reads, written as webdataset tar shards and an ``_info.json`` that timm's
``ReaderWds`` reads (``timm.data.create_dataset("wds/...", root=DIR)``).

The format (see the README): per split ``S``, shards ``S-000000.tar``, ``S-000001.tar``, ... whose samples are keyed
``"%08d" % index`` in the dataset's order, each holding the image (``jpg``, ``png`` or the original file's extension)
and the label (``cls``: the class index as ASCII) or, for segmentation, the mask (``mask.png``: train ids, 255
ignored). Every tar member has mtime 0, uid/gid 0, no owner names and mode 0o444, so one input packs to the same bytes.

A pack is resumable. Each shard is written to ``<shard>.tmp``, flushed to disk and renamed into place, and the
shards done so far are recorded in ``S.packing.json`` (with the pack's options); a pack killed at any moment
continues from its last whole shard, and the result is byte-identical to an uninterrupted pack. The split enters
``_info.json`` (rewritten atomically, other splits kept) only once all its shards are written; then the record is
removed and ``pack_summary.json`` gains the split's counts.

Shards (``--dataset wds``) are a source too: packed again, they take another shard size or encoding; with the same
options they give the same bytes.

Every image is decoded and every label checked while packing; a bad one stops the pack with a one-line error naming
the sample, and the shards already finished stay for a rerun to continue from.
"""
from __future__ import annotations

import io
import json
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..utils.values import first_line
from .segmentation import IGNORE_INDEX, check_train_ids, read_index_mask

__all__ = ["TASKS", "ENCODINGS", "DEFAULT_SHARD_BYTES", "DEFAULT_QUALITY", "PackSource", "open_source", "pack",
           "samples_source", "write_samples", "shard_name", "INFO_NAME", "SUMMARY_NAME", "format_bytes",
           "check_output", "check_split_name"]

TASKS = ("classification", "segmentation")
ENCODINGS = ("keep", "jpeg")
#: shard size when neither --shard-samples nor --shard-bytes is given (webdataset suggests 100 MB to 1 GB)
DEFAULT_SHARD_BYTES = 256 * 2 ** 20
DEFAULT_QUALITY = 90
INFO_NAME = "_info.json"
SUMMARY_NAME = "pack_summary.json"
#: the version of the shard layout written here, kept with each split's options
FORMAT_VERSION = 1

_BLOCK, _RECORD = tarfile.BLOCKSIZE, tarfile.RECORDSIZE


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:06d}.tar"


def _state_name(split: str) -> str:
    return f"{split}.packing.json"


# ------------------------------------------------------------------------------------------------ image bytes
def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(img, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _extension(path: str) -> str:
    ext = Path(path).suffix.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext


def _decoded(data: bytes, where: str):
    """The RGB image of ``data`` (as the folder reader would make it), or a one-line ValueError naming ``where``."""
    from PIL import Image

    from .images import to_rgb
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return to_rgb(img)
    except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), SyntaxError, DecompressionBomb...
        raise ValueError(f"{where}: cannot decode the image: {type(e).__name__}: {first_line(e)}") from None


def _read_bytes(path: str, where: str) -> bytes:
    if not os.path.isfile(path):  # a FIFO or device named like an image: opening it would block or never end
        raise ValueError(f"{where}: cannot read the file: not a regular file")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{where}: cannot read the file: {e.strerror or e}") from None


# ------------------------------------------------------------------------------------------------ sources
@dataclass
class PackSource:
    """One split of a dataset, as the samples to pack: ``members(i)`` gives sample ``i``'s (extension, bytes) pairs
    (image first), decoded and checked. ``targets`` (classification) gives the labels without reading images."""
    name: str
    task: str
    classes: List[str]
    size: int
    members: Callable[[int], List[Tuple[str, bytes]]]
    inputs: Dict[str, str]
    targets: Optional[Sequence[int]] = None
    extra: Optional[Dict[str, Any]] = None


def _image_member(where: str, encode: str, quality: int, *, path: Optional[str] = None,
                  image=None) -> Tuple[str, bytes]:
    """The image of a sample: a file's own bytes (``keep``) or an in-memory image as PNG, or either as JPEG."""
    if path is not None:
        data = _read_bytes(path, where)
        rgb = _decoded(data, where)
        return ("jpg", _jpeg(rgb, quality)) if encode == "jpeg" else (_extension(path), data)
    return ("jpg", _jpeg(image.convert("RGB"), quality)) if encode == "jpeg" else ("png", _png(image))


def _label_text(label, num_classes: int, where: str) -> str:
    """``label`` as the ASCII of a ``cls`` member, or a one-line ValueError when it is no class index."""
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not 0 <= label < num_classes:
        raise ValueError(f"{where}: label {label!r} is outside the {num_classes} classes (0..{num_classes - 1})")
    return str(int(label))


def _classification_source(dataset: str, data_dir, split: str, encode: str, quality: int) -> PackSource:
    from .factory import DATASETS, create_dataset
    from .folder import SkippingImageFolder
    kind = DATASETS[dataset.lower()]
    ds = create_dataset(dataset, data_dir, split)
    classes = [str(c) for c in ds.classes]
    targets = [int(t) for t in ds.targets]
    where = f"split {split!r} sample"

    def check_label(i: int, label) -> str:
        return _label_text(label, len(classes), f"{where} {i}")

    if isinstance(ds, SkippingImageFolder):
        def members(i: int) -> List[Tuple[str, bytes]]:
            path, label = ds.samples[i]
            return [_image_member(f"{where} {i} ({path})", encode, quality, path=path),
                    ("cls", check_label(i, label).encode())]
    else:
        def members(i: int) -> List[Tuple[str, bytes]]:
            image, label = ds[i]
            return [_image_member(f"{where} {i}", encode, quality, image=image),
                    ("cls", check_label(i, label).encode())]
    inputs = {"--data-dir": str(data_dir)} if data_dir is not None else {}
    return PackSource(kind, "classification", classes, len(ds), members, inputs, targets=targets)


def _segmentation_source(dataset: str, data_dir, split: str, encode: str, quality: int, classes_file,
                         dataset_kwargs: Mapping[str, Any]) -> PackSource:
    from PIL import Image

    from .segmentation import SEG_DATASETS, FileSegmentationDataset, create_segmentation_dataset
    kind = SEG_DATASETS[dataset.lower()]
    ds = create_segmentation_dataset(dataset, data_dir, split, train=False, classes_file=classes_file,
                                     **dict(dataset_kwargs))
    k = ds.num_classes
    files = isinstance(ds, FileSegmentationDataset)

    def members(i: int) -> List[Tuple[str, bytes]]:
        where = f"split {split!r} sample {i}" + (f" ({ds.images[i]})" if files else "")
        try:
            image, mask = ds.read(i)
        except ValueError as e:
            raise ValueError(f"split {split!r} sample {i}: {first_line(e)}") from None
        check_train_ids(mask, k, where)
        if files and os.path.isfile(ds.images[i]):  # a saved HF dataset names its rows there, not files
            picture = _image_member(where, encode, quality, path=ds.images[i])
        else:
            picture = _image_member(where, encode, quality, image=Image.fromarray(image, mode="RGB"))
        return [picture, ("mask.png", _png(Image.fromarray(mask.astype(np.uint8), mode="L")))]

    inputs = {}
    if data_dir is not None:
        inputs["--data-dir"] = str(data_dir)
    if classes_file is not None:
        inputs["--classes-file"] = str(classes_file)
    extra = {"ignore_index": IGNORE_INDEX, "palette": [list(c) for c in ds.palette], "label_ids": list(ds.label_ids)}
    return PackSource(kind, "segmentation", list(ds.classes), len(ds), members, inputs, extra=extra)


def _shards_source(task: str, data_dir, split: str, encode: str, quality: int) -> PackSource:
    """Shards packed before (a folder, brace pattern or ``pipe:`` URL), packed again: another shard size or encoding.
    Tars are read in order, so ``members(i)`` asks for the samples one after the other (a resumed pack skips to its
    first sample)."""
    from PIL import Image

    from .shards import is_local, open_shards
    ds = open_shards(data_dir, split, None, task)
    reading: Dict[str, Any] = {"next": None, "samples": None}

    def members(i: int) -> List[Tuple[str, bytes]]:
        if reading["next"] != i:
            reading["samples"] = ds.raw_samples()
            for _ in range(i):
                next(reading["samples"])
        index, shard, sample = next(reading["samples"])
        reading["next"] = i + 1
        where = f"split {split!r} sample {i} (shard {shard})"
        item = ds.decode(sample, shard)  # a ShardError (one line) for a missing label or mask, or one out of range
        if item is None:
            raise ValueError(f"{where}: cannot decode the image")
        ext = ds.image_member(sample)
        if encode == "jpeg":
            rgb = item[0] if task == "classification" else Image.fromarray(item[0], mode="RGB")
            picture = ("jpg", _jpeg(rgb, quality))
        else:
            picture = ("jpg" if ext == "jpeg" else ext, sample[ext])
        if task == "classification":
            return [picture, ("cls", str(item[1]).encode())]
        return [picture, ("mask.png", _png(Image.fromarray(item[1].astype(np.uint8), mode="L")))]

    extra = None
    if task == "segmentation":
        extra = {"ignore_index": ds.ignore_index, "palette": [list(c) for c in ds.palette],
                 "label_ids": list(ds.label_ids)}
    # the folder of local shards is the input an output may not be (pipe: and remote URLs name none here)
    first = ds.urls[0]
    inputs = {"--data-dir": os.path.dirname(os.path.abspath(first))} if is_local(first) else {}
    return PackSource(ds.name, task, list(ds.classes), len(ds), members, inputs, extra=extra)


def open_source(task: str, dataset: str, data_dir, split: str, encode: str = "keep",
                quality: int = DEFAULT_QUALITY, classes_file=None,
                dataset_kwargs: Optional[Mapping[str, Any]] = None) -> PackSource:
    """The samples of ``split`` of ``dataset`` (a name of :data:`~simattn.data.factory.DATASETS` for
    classification, of :data:`~simattn.data.segmentation.SEG_DATASETS` for segmentation)."""
    from ..utils.values import quoted
    from .factory import DATASETS
    from .segmentation import SEG_DATASETS
    tables = {"classification": DATASETS, "segmentation": SEG_DATASETS}
    if task not in tables:
        raise ValueError(f"--task {quoted(task)}: allowed: {', '.join(TASKS)}")
    name = str(dataset).lower()
    if name not in tables[task]:
        other = next(t for t in TASKS if t != task)
        hint = f" ({quoted(dataset)} is a {other} dataset: add --task {other})" if name in tables[other] else ""
        raise ValueError(f"--dataset {quoted(dataset)}: unknown {task} dataset; known: "
                         f"{', '.join(tables[task])}{hint}")
    embedded = tables[task][name] == "digits"
    if embedded and data_dir is not None:
        raise ValueError(f"--data-dir {quoted(data_dir)}: the {task} dataset 'digits' is embedded and reads no folder; "
                         "leave --data-dir out")
    if dataset_kwargs and not (task == "segmentation" and embedded):
        raise ValueError("--dataset-kwargs apply to the segmentation digit scenes only (--task segmentation "
                         "--dataset digits)")
    if classes_file is not None and not (task == "segmentation" and tables[task][name] == "folder"):
        raise ValueError("--classes-file applies to the segmentation folder layout only (--task segmentation "
                         "--dataset folder)")
    if tables[task][name] == "wds":
        return _shards_source(task, data_dir, split, encode, quality)
    if task == "classification":
        return _classification_source(dataset, data_dir, split, encode, quality)
    return _segmentation_source(dataset, data_dir, split, encode, quality, classes_file, dataset_kwargs or {})


def _members_digest(samples: Sequence[Sequence[Tuple[str, bytes]]]) -> str:
    import hashlib
    digest = hashlib.sha256()
    for members in samples:
        for ext, data in members:
            digest.update(f"{ext}\0{len(data)}\0".encode())
            digest.update(data)
        digest.update(b"\1")
    return digest.hexdigest()


def samples_source(name: str, task: str, classes: Sequence[str], samples: Sequence[Sequence[Tuple[str, bytes]]], *,
                   extra: Optional[Mapping[str, Any]] = None) -> PackSource:
    """Samples already encoded, as a source to :func:`pack`: each sample is its (extension, bytes) members, the image
    first (under its format's extension: ``jpg``, ``png``, ...), then ``cls`` (the label as ASCII) or ``mask.png``
    (train ids, 255 ignored). They are checked as a dataset's are: labels now, each image (and mask) as it is
    packed. ``extra``: more ``_info.json`` keys (segmentation: ``palette``, ``label_ids``)."""
    from PIL import Image
    if task not in TASKS:
        raise ValueError(f"task {task!r}: allowed: {', '.join(TASKS)}")
    classes = [str(c) for c in classes]
    k = len(classes)
    samples = [list(members) for members in samples]
    target = "cls" if task == "classification" else "mask.png"
    for i, members in enumerate(samples):
        exts = [ext for ext, _ in members]
        if len(members) < 2 or exts[0] == target or target not in exts:
            raise ValueError(f"sample {i}: members {exts}; expected the image first, then {target!r}")
    targets = None
    if task == "classification":
        targets = []
        for i, members in enumerate(samples):
            text = dict(members)["cls"]
            try:
                label = int(text.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                raise ValueError(f"sample {i}: label {text[:40]!r} is no class index") from None
            _label_text(label, k, f"sample {i}")
            targets.append(label)

    def members(i: int) -> List[Tuple[str, bytes]]:
        where = f"sample {i}"
        image = _decoded(samples[i][0][1], where)
        if task == "segmentation":
            data = dict(samples[i])["mask.png"]
            mask = read_index_mask(lambda: Image.open(io.BytesIO(data)), f"of {where}", image.size[::-1])
            check_train_ids(mask.astype(np.int64), k, where)
        return samples[i]

    head = {"ignore_index": IGNORE_INDEX} if task == "segmentation" else {}
    return PackSource(name, task, classes, len(samples), members, {}, targets=targets,
                      extra={**head, **dict(extra or {})} or None)


def write_samples(samples: Sequence[Sequence[Tuple[str, bytes]]], split: str, output, *, name: str,
                  classes: Sequence[str], task: str = "classification", extra: Optional[Mapping[str, Any]] = None,
                  shard_samples: Optional[int] = None, shard_bytes: Optional[int] = None,
                  show_progress: bool = False, log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Pack encoded ``samples`` (see :func:`samples_source`) as the shards of ``split`` in ``output`` with
    ``_info.json``, as :func:`pack` does (``shard_bytes`` defaults to :data:`DEFAULT_SHARD_BYTES` when neither size is
    given); returns the split's summary. Silent unless ``log`` is given (it gets each line of progress)."""
    samples = [list(members) for members in samples]
    source = samples_source(name, task, classes, samples, extra=extra)
    if shard_samples is None and shard_bytes is None:
        shard_bytes = DEFAULT_SHARD_BYTES
    # the samples' digest makes a rerun with other samples a pack of other options, never a resumption
    options = {"task": task, "dataset": name, "split": split, "samples_sha256": _members_digest(samples),
               "shard_samples": shard_samples, "shard_bytes": shard_bytes}
    return pack(source, split, output, options, shard_samples=shard_samples, shard_bytes=shard_bytes,
                show_progress=show_progress, log=log or (lambda line: None))


# ------------------------------------------------------------------------------------------------ checks
_SPLIT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


def check_split_name(split: str) -> None:
    from ..utils.values import quoted
    if not _SPLIT.match(split) or len(split) > 80:
        raise ValueError(f"--split {quoted(split)}: allowed: letters, digits, '_' and '-' (at most 80), such as "
                         "train or val (it names the shards)")
    if "tar" in split:  # timm reads a split holding "tar" as a shard pattern, not a split name
        raise ValueError(f"--split {quoted(split)}: a split name may not contain 'tar' (timm reads such a split "
                         "as a shard file pattern)")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_output(output: Path, inputs: Mapping[str, str]) -> None:
    """Refuse (one-line ValueError) an output folder that is a file, is one of the inputs, lies inside one, or
    holds one, before anything is written."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file; the shards are written into a folder")
    out = os.path.realpath(output)
    for flag, given in inputs.items():
        source = os.path.realpath(given)
        if _inside(out, source):
            what = "is" if out == source else "is inside"
            raise ValueError(f"--output {output} {what} the input {flag} {given}: the shards would be written among "
                             "the data they are read from; choose a folder outside it")
        if _inside(source, out):
            raise ValueError(f"--output {output} holds the input {flag} {given}: the shards would be written among "
                             "the data they are read from; choose a folder outside it")


def _read_json(path: Path) -> Optional[Dict[str, Any]]:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {type(e).__name__}: {first_line(e)} (fix or remove it)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a {type(data).__name__}, not a JSON object (fix or remove it)")
    return data


def _dataset_header(source: PackSource) -> Dict[str, Any]:
    head: Dict[str, Any] = {"name": source.name, "task": source.task, "classes": list(source.classes),
                            "num_classes": len(source.classes)}
    head.update(source.extra or {})
    return head


def _check_same_dataset(info: Mapping[str, Any], head: Mapping[str, Any], out: Path) -> None:
    """The splits of one folder are of one dataset: the same task, name and classes."""
    for key in ("task", "name", "classes"):
        if key in info and info[key] != head[key]:
            theirs = info.get("name", "?"), info.get("task", "?"), len(info.get("classes") or [])
            raise ValueError(f"--output {out} holds the shards of {theirs[0]!r} ({theirs[1]}, {theirs[2]} classes), "
                             f"not of {head['name']!r} ({head['task']}, {head['num_classes']} classes): pack the "
                             "splits of one dataset per folder; choose another --output")


def _describe_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return ", ".join(f"{k} {old.get(k)!r} now {new.get(k)!r}" for k in keys[:4])


# ------------------------------------------------------------------------------------------------ writing
def _member_bytes(members: Sequence[Tuple[str, bytes]]) -> int:
    return sum(_BLOCK + -(-len(data) // _BLOCK) * _BLOCK for _, data in members)


def _file_bytes(content: int) -> int:
    """The size of a tar file holding ``content`` bytes of headers and data: two zero blocks end it and tarfile
    pads it to whole records."""
    return -(-(content + 2 * _BLOCK) // _RECORD) * _RECORD


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _ShardFile:
    """One shard being written to ``<name>.tmp``; :meth:`finish` flushes it to disk and renames it into place."""

    def __init__(self, path: Path) -> None:
        self.path, self.tmp = path, path.with_name(path.name + ".tmp")
        self.file = open(self.tmp, "wb")
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.USTAR_FORMAT)
        self.samples = self.content = 0

    def add(self, key: str, members: Sequence[Tuple[str, bytes]]) -> None:
        for ext, data in members:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o444
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self.tar.addfile(info, io.BytesIO(data))
        self.samples += 1
        self.content += _member_bytes(members)

    def finish(self) -> int:
        self.tar.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        _fsync_dir(self.path.parent)
        return self.path.stat().st_size

    def abandon(self) -> None:
        try:
            self.tar.close()
        except Exception:  # a shard that failed mid-way: it is removed anyway
            pass
        self.file.close()
        self.tmp.unlink(missing_ok=True)


def _intact(out: Path, shards: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The recorded shards, up to the first that is missing or whose size changed."""
    kept = []
    for shard in shards:
        path = out / shard["filename"]
        if not path.is_file() or path.stat().st_size != shard["bytes"]:
            break
        kept.append(shard)
    return kept


def _remove_leftovers(out: Path, split: str, keep: int) -> None:
    """Temporary shards of ``split`` and its shards after the first ``keep`` (a rename the record did not get to)."""
    pattern = re.compile(rf"^{re.escape(split)}-(\d{{6}})\.tar(\.tmp)?$")
    for entry in os.scandir(out):
        m = pattern.match(entry.name)
        if m and (m.group(2) or int(m.group(1)) >= keep):
            os.unlink(entry.path)


def format_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"


def _split_summary(source: PackSource, shards: List[Dict[str, Any]], options: Mapping[str, Any]) -> Dict[str, Any]:
    summary = {"samples": sum(s["samples"] for s in shards), "shards": len(shards),
               "bytes": sum(s["bytes"] for s in shards), "classes": len(source.classes), "task": source.task,
               "dataset": source.name, "encode": options.get("encode")}
    if source.targets is not None:
        counts = np.bincount(np.asarray(source.targets, np.int64), minlength=len(source.classes))
        summary["class_counts"] = {c: int(n) for c, n in zip(source.classes, counts.tolist())}
    return summary


def pack(source: PackSource, split: str, output, options: Mapping[str, Any], *, shard_samples: Optional[int] = None,
         shard_bytes: Optional[int] = None, show_progress: Optional[bool] = None,
         log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Write ``source`` as the shards of ``split`` in ``output`` (resuming a pack of the same ``options`` killed
    before), then add the split to ``_info.json`` and ``pack_summary.json``; returns the split's summary.

    ``options`` are what makes the shards (dataset, folder, encoding, shard size, ...): a pack in progress or a
    split already packed with other options is refused in one line.
    """
    from ..utils.runs import lock_run_folder, release_run_folder
    from ..utils.io import atomic_write_json
    from ..utils.runlog import use_tqdm

    check_split_name(split)
    if (shard_samples is None) == (shard_bytes is None):
        raise ValueError("give one shard size: shard_samples or shard_bytes")
    out = Path(output)
    check_output(out, source.inputs)
    # as JSON holds them, so that a recorded pack compares equal to the same pack given again
    options = json.loads(json.dumps({**dict(options), "format": FORMAT_VERSION, "num_samples": source.size}))
    head = _dataset_header(source)
    info_path, state_path = out / INFO_NAME, out / _state_name(split)
    out.mkdir(parents=True, exist_ok=True)
    took = lock_run_folder(out)
    try:
        info = _read_json(info_path) or {}
        if info:
            _check_same_dataset(info, head, out)
        done = (info.get("splits") or {}).get(split)
        state = _read_json(state_path)
        if done is not None:
            if done.get("pack") != options:
                raise ValueError(f"--output {out} already holds split {split!r} packed with other options "
                                 f"({_describe_difference(done.get('pack') or {}, options) or 'not recorded'}): "
                                 "choose another --output or --split, or remove that split's shards")
            log(f"split {split!r} is already packed in {out}")
            shards = [{"filename": f, "samples": n, "bytes": (out / f).stat().st_size if (out / f).is_file() else 0}
                      for f, n in zip(done["filenames"], done["shard_lengths"])]
        else:
            if state is not None and state.get("options") != options:
                raise ValueError(f"--output {out} holds an unfinished pack of split {split!r} with other options "
                                 f"({_describe_difference(state.get('options') or {}, options)}): rerun it as it was "
                                 f"to finish it, or remove {state_path.name} and {split}-*.tar to start over")
            if state is None:
                foreign = sorted(p.name for p in out.glob(f"{split}-*.tar"))
                if foreign:
                    raise ValueError(f"--output {out} holds {foreign[0]} but no pack of split {split!r} in progress "
                                     f"(no {state_path.name}): choose another --output or remove those shards")
                state = {"options": options, "shards": []}
                atomic_write_json(state, state_path)
            shards = _intact(out, state["shards"])
            _remove_leftovers(out, split, len(shards))
            shards = _write_shards(source, split, out, state, shards, state_path, shard_samples, shard_bytes,
                                   use_tqdm(True) if show_progress is None else show_progress, log)
        entry = {"name": split, "num_samples": sum(s["samples"] for s in shards),
                 "filenames": [s["filename"] for s in shards], "shard_lengths": [s["samples"] for s in shards],
                 "pack": options}
        splits = {**(info.get("splits") or {}), split: entry}
        rest = {k: v for k, v in info.items() if k not in head and k != "splits"}
        atomic_write_json({**head, **rest, "splits": splits}, info_path)
        summary = _split_summary(source, shards, options)
        all_summaries = _read_json(out / SUMMARY_NAME) or {}
        all_summaries.setdefault("splits", {})[split] = summary
        atomic_write_json(all_summaries, out / SUMMARY_NAME)
        state_path.unlink(missing_ok=True)
        return summary
    finally:
        if took:  # this folder only: others this process holds (a run writing copies) stay locked
            release_run_folder(out)


def _write_shards(source: PackSource, split: str, out: Path, state: Dict[str, Any], shards: List[Dict[str, Any]],
                  state_path: Path, shard_samples: Optional[int], shard_bytes: Optional[int], bar: bool,
                  log: Callable[[str], None]) -> List[Dict[str, Any]]:
    """Pack the samples after those of the whole ``shards`` already written, recording each finished shard."""
    from ..utils.io import atomic_write_json
    start = sum(s["samples"] for s in shards)
    total = source.size
    resumed = f" (resuming after {len(shards)} whole shards, {start} samples)" if shards else ""
    log(f"packing {source.name} {split}: {total} samples -> {out}{resumed}")
    progress = None
    if bar:
        from tqdm import tqdm
        progress = tqdm(total=total, initial=start, desc=f"pack {split}", unit="img", leave=False,
                        dynamic_ncols=True)
        log = progress.write
    current: Optional[_ShardFile] = None

    def finish() -> None:
        size = current.finish()
        shards.append({"filename": current.path.name, "samples": current.samples, "bytes": size})
        state["shards"] = shards
        atomic_write_json(state, state_path)
        done = sum(s["samples"] for s in shards)
        log(f"shard {current.path.name}: {current.samples} samples, {format_bytes(size)} ({done}/{total} samples)")

    try:
        for i in range(start, total):
            members = source.members(i)
            if (current is not None and shard_bytes is not None
                    and _file_bytes(current.content + _member_bytes(members)) > shard_bytes):
                finish()
                current = None
            if current is None:
                current = _ShardFile(out / shard_name(split, len(shards)))
            current.add(f"{i:08d}", members)
            if progress is not None:
                progress.update(1)
            if shard_samples is not None and current.samples >= shard_samples:
                finish()
                current = None
        if current is not None:
            finish()
            current = None
    finally:
        if current is not None:  # stopped by an error or Ctrl-C: no half-written shard is left
            current.abandon()
        if progress is not None:
            progress.close()
    return shards
