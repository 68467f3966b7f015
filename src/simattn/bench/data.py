"""``simattn bench data``: does the data loader keep up with the model?

It reads the SAME images stored three ways — an image folder (one PNG/JPEG file per image), webdataset tar shards
(the format of ``simattn data pack``) and a Hugging Face dataset written by ``save_to_disk`` — through the
training transform of a recipe (default ``digits_cpu``'s: random resized crop, flip, normalise) at ``--img-size``,
in a ``DataLoader`` of ``--batch-size`` with each of ``--workers`` worker processes (0 = in the main process),
and times it:

* ``ips``: images/s of a whole pass over the copy with the workers already started (persistent, as training keeps
  them), the median over ``--rounds`` with its min and max;
* ``worker_ips``: images/s of one worker while it works (its decode + augment + collate time, measured inside the
  worker), the mean over the workers that took part;
* ``first_pass_ips`` and ``first_batch_s``: the first pass, which starts the workers (not part of ``ips``): what an
  epoch costs with start-up, and the time to its first batch.

Beside them, the recipe's model at the same size: images/s of its training step (forward + backward + optimizer
step, batch ``--batch-size``, :mod:`simattn.bench.model` in a fresh process per round). A loader whose ``ips`` is
below the model's starves it: add workers or a faster storage. On a CPU the loader and the model share the cores
in a real run, so there the two numbers are upper bounds that do not add up.

Inputs: by default the bench builds the three copies itself in a temporary folder from ``--dataset``/``--data-dir``
(``--images`` of them, resized to ``--store-size`` on their short side and encoded as ``--format``, byte-identical
in all three copies), or takes existing copies with ``--folder``, ``--shards`` and ``--hfds``. Readers:
``create_dataset('folder' | 'wds' | 'hfds', ...)``, the ones training uses. Results go to
``bench_data.{json,csv,md,png}`` in ``--output``. Example::

    simattn bench data --img-size 224 --images 1024 --workers 0 2 4 --rounds 3
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..data.factory import DATASETS, create_dataset
from ..utils.values import OPTIONS_HELP, quoted
from .cli import check_bench_flags, check_out, refuse_unused, require_cuda, result_files
from .report import machine_info, markdown_table, new_figure, relative_spread, save_figure, spread_warning, \
    write_result_files

__all__ = ["READERS", "FORMATS", "write_shards", "write_folder", "write_hfds", "build_copies", "open_copy",
           "measure_pass", "run_loaders", "plot_results", "main"]

#: reader → the dataset name ``create_dataset`` opens it with
READERS = {"folder": "folder", "shards": "wds", "hfds": "hfds"}
FORMATS = ("jpg", "png")
MB = 2 ** 20


# ------------------------------------------------------------------------------------------------ the copies
def source_samples(source: Dataset, count: int, store_size: int, fmt: str,
                   quality: int) -> Tuple[List[str], List[Tuple[bytes, int]]]:
    """``count`` images of ``source`` (a dataset of ``create_dataset``; evenly spread over it, so every class is
    there), resized to ``store_size`` on their short side (0: as they are) and encoded as ``fmt``:
    ``(classes, [(encoded bytes, label), ...])``."""
    from PIL import Image

    classes = [str(c) for c in source.classes]
    picks = sorted({int(i * len(source) / count) for i in range(count)})
    samples = []
    for index in picks:
        item = source[index]
        if item is None:  # an unreadable file of a folder
            continue
        img, label = item
        if store_size:
            w, h = img.size
            scale = store_size / min(w, h)
            img = img.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BILINEAR)
        buf = io.BytesIO()
        if fmt == "jpg":
            img.save(buf, format="JPEG", quality=quality)
        else:
            img.save(buf, format="PNG")
        samples.append((buf.getvalue(), int(label)))
    return classes, samples


def write_folder(samples: Sequence[Tuple[bytes, int]], root: Path, split: str, classes: Sequence[str],
                 fmt: str) -> Path:
    """An image folder ``root/<split>/<class>/<index>.<fmt>``; class folders are named ``<label>_<name>`` (zero-
    padded label first) so their sorted order is the label order."""
    width = len(str(len(classes) - 1))
    for i, (data, label) in enumerate(samples):
        folder = root / split / f"{label:0{width}d}_{_safe(classes[label])}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:08d}.{fmt}").write_bytes(data)
    return root


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "class"


def write_hfds(samples: Sequence[Tuple[bytes, int]], root: Path, split: str, classes: Sequence[str]) -> Path:
    """A Hugging Face ``DatasetDict`` with one split (an ``Image`` and a ``ClassLabel`` column), saved to ``root``."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(classes))})
    table = {"image": [{"bytes": data, "path": None} for data, _ in samples], "label": [y for _, y in samples]}
    was = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        datasets.DatasetDict({split: datasets.Dataset.from_dict(table, features=features)}).save_to_disk(str(root))
    finally:
        if was:
            datasets.enable_progress_bars()
    return root


def write_shards(samples: Sequence[Tuple[bytes, int]], root: Path, split: str, classes: Sequence[str], fmt: str,
                 name: str, shard_samples: int = 256) -> Path:
    """Webdataset tar shards ``root/<split>-NNNNNN.tar`` and ``root/_info.json``, written by ``simattn data pack``'s
    writer (:func:`simattn.data.pack.write_samples`)."""
    from ..data.pack import write_samples

    members = [[(fmt, data), ("cls", str(label).encode("ascii"))] for data, label in samples]
    write_samples(members, split, root, name=name, classes=classes, shard_samples=shard_samples)
    return root


def build_copies(samples, classes, work: Path, split: str, fmt: str, name: str,
                 readers: Sequence[str], workers: int = 1) -> Dict[str, Path]:
    """The copies of ``samples`` that ``readers`` read, written under ``work``; the shards are at least ``workers``
    (a loader's workers read distinct shards: fewer shards would leave workers idle)."""
    per_shard = max(1, min(256, -(-len(samples) // max(1, workers))))
    writers = {"folder": lambda p: write_folder(samples, p, split, classes, fmt),
               "shards": lambda p: write_shards(samples, p, split, classes, fmt, name, per_shard),
               "hfds": lambda p: write_hfds(samples, p, split, classes)}
    return {reader: writers[reader](work / reader) for reader in readers}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def open_copy(reader: str, root, split: str, transform) -> Dataset:
    """The dataset training would open for copy ``root`` (``create_dataset``'s reader for ``reader``)."""
    return create_dataset(READERS[reader], root, split, transform=transform)


# ------------------------------------------------------------------------------------------------ timing
class _Timed(Dataset):
    """``(item, seconds spent getting it, worker id)`` for each item of a map-style dataset."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index):
        start = time.perf_counter()
        item = self.inner[index]
        return item, time.perf_counter() - start


class _TimedIterable(IterableDataset):
    """The same for an iterable dataset (the shard reader): the time of each ``next`` in the worker."""

    def __init__(self, inner: IterableDataset) -> None:
        self.inner = inner

    def __iter__(self):
        items = iter(self.inner)
        while True:
            start = time.perf_counter()
            try:
                item = next(items)
            except StopIteration:
                return
            yield item, time.perf_counter() - start


def _collate(batch):
    """In the worker: stack the readable images; ``(images, labels, busy seconds, worker id)``."""
    from torch.utils.data import default_collate, get_worker_info
    start = time.perf_counter()
    items = [item for item, _ in batch if item is not None]
    images, labels = default_collate(items) if items else (torch.empty(0), torch.empty(0, dtype=torch.long))
    busy = sum(seconds for _, seconds in batch) + time.perf_counter() - start
    info = get_worker_info()
    return images, labels, busy, info.id if info is not None else 0


def make_loader(dataset: Dataset, batch_size: int, workers: int, seed: int = 0) -> DataLoader:
    """A loader as training builds one: shuffled (map-style: by the loader; shards: their per-epoch order and
    sample buffer), workers kept across passes (persistent)."""
    iterable = isinstance(dataset, IterableDataset)
    if iterable:
        dataset.configure(seed=seed, shuffle=True)
    timed = _TimedIterable(dataset) if iterable else _Timed(dataset)
    return DataLoader(timed, batch_size=batch_size, num_workers=workers, collate_fn=_collate,
                      shuffle=not iterable, generator=None if iterable else torch.Generator().manual_seed(seed),
                      persistent_workers=workers > 0)


def measure_pass(loader: DataLoader) -> Dict[str, Any]:
    """One timed pass over ``loader``: images/s over the pass, each worker's images/s while it works, time to the
    first batch."""
    busy: Dict[int, float] = {}
    done: Dict[int, int] = {}
    images, first = 0, None
    start = time.perf_counter()
    for batch, _, seconds, worker in loader:
        if first is None:
            first = time.perf_counter() - start
        images += len(batch)
        busy[worker] = busy.get(worker, 0.0) + seconds
        done[worker] = done.get(worker, 0) + len(batch)
    wall = time.perf_counter() - start
    per_worker = [done[w] / busy[w] for w in done if busy[w] > 0 and done[w]]
    return {"images": images, "wall_s": wall, "ips": images / wall if wall > 0 else None,
            "worker_ips": statistics.mean(per_worker) if per_worker else None, "first_batch_s": first,
            "active_workers": len(per_worker)}


def run_loaders(copies: Dict[str, Path], split: str, transform, batch_size: int, workers: Sequence[int],
                rounds: int, seed: int = 0) -> List[Dict[str, Any]]:
    """One row per reader × worker count. A first pass starts the workers (``first_pass_ips``,
    ``first_batch_s``: what an epoch costs with start-up); then ``rounds`` interleaved passes with the same workers
    give the steady ``ips`` and ``worker_ips`` (medians, min and max beside them); the order rotates each round."""
    from .report import progress

    loaders = {(reader, w): make_loader(open_copy(reader, root, split, transform), batch_size, w, seed)
               for reader, root in copies.items() for w in workers}
    # each round starts at the next configuration: a pass's place in the round (right after which other pass)
    # measured up to 10 % on a 2-core machine, so no reader keeps the same place
    keys = list(loaders)
    jobs = [(r, keys[(i + r) % len(keys)]) for r in range(rounds + 1) for i in range(len(keys))]
    passes: Dict[Tuple[str, int], List[Dict[str, Any]]] = {key: [] for key in loaders}

    def describe(job):
        r, (reader, w) = job
        return f"{reader} x {w} workers " + ("(first pass: start-up)" if r == 0 else f"(round {r})")

    try:
        for r, key in progress(jobs, "bench data", describe):
            passes[key].append(measure_pass(loaders[key]))
    finally:
        for loader in loaders.values():  # ends the persistent workers now, not at garbage collection
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
    rows = []
    for (reader, w), (first, *runs) in passes.items():
        row: Dict[str, Any] = {"what": reader, "workers": w, "images": first["images"],
                               "copy_mb": folder_bytes(copies[reader]) / MB, "batch_size": batch_size,
                               "first_pass_ips": first["ips"], "first_batch_s": first["first_batch_s"]}
        for key in ("ips", "worker_ips"):
            values = [run[key] for run in runs if run[key] is not None]
            if values:
                row[key] = statistics.median(values)
                row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
                if len(values) > 1:
                    row[f"{key}_rounds"] = values
        row["active_workers"] = max(run["active_workers"] for run in runs)
        row["rounds"] = len(runs)
        rows.append(row)
    return rows


def model_row(cfg, img_size: int, batch_size: int, device: str, threads: int, rounds: int, repeats: int,
              max_time: float, in_process: bool, timeout: Optional[float]) -> Dict[str, Any]:
    """The recipe's model: images/s of its training step (:mod:`simattn.bench.model`'s train-throughput)."""
    from .model.spec import BenchSpec
    from .model.workers import run_specs

    spec = BenchSpec(model=cfg.model, model_kwargs=dict(cfg.model_kwargs), img_size=img_size, device=device,
                     threads=threads, batch_size=batch_size, measures=("train-throughput",), warmup=1,
                     repeats=repeats, max_time=max_time, label="train step")
    result = run_specs([spec], rounds=rounds, in_process=in_process, timeout=timeout, desc="bench data: model")[0]
    row = {"what": f"model train step ({cfg.model})", "workers": None, "batch_size": batch_size,
           "ips": result.get("train_ips"), "ips_min": result.get("train_ips_p10"),
           "ips_max": result.get("train_ips_p90"), "device": device, "threads": result.get("threads", threads),
           "params_m": result.get("params_m"), "rounds": result.get("rounds")}
    if "error" in result:
        row["error"] = result["error"]
    if result.get("train_ips_rounds"):
        row["ips_rounds"] = result["train_ips_rounds"]
    return row


# ------------------------------------------------------------------------------------------------ output
COLUMNS = ["what", "workers", "images", "batch_size", "ips", "ips_min", "ips_max", "worker_ips", "worker_ips_min",
           "worker_ips_max", "first_pass_ips", "first_batch_s", "active_workers", "copy_mb", "of_model", "starves", "device",
           "threads", "params_m", "rounds", "error"]


def _label(row: Dict[str, Any]) -> str:
    if row.get("workers") is None:
        return row["what"]
    return f"{row['what']} × {row['workers']} workers" if row["workers"] else f"{row['what']} in the main process"


def plot_results(rows: Sequence[Dict[str, Any]], model: Optional[Dict[str, Any]], path: Path, title: str) -> None:
    """Horizontal bars: each reader × workers' images/s (min-max whiskers), each worker's images/s as a dot, the
    model's training throughput as a dashed line."""
    fig, (ax,) = new_figure(1, size=7.0)
    labels = [_label(r) for r in rows]
    ips = [r.get("ips") or 0.0 for r in rows]
    low = [max(0.0, v - (r.get("ips_min") or v)) for r, v in zip(rows, ips)]
    high = [max(0.0, (r.get("ips_max") or v) - v) for r, v in zip(rows, ips)]
    colours = {"folder": "tab:blue", "shards": "tab:green", "hfds": "tab:orange"}
    ys = list(range(len(rows)))
    ax.barh(ys, ips, xerr=[low, high], color=[colours.get(r["what"], "tab:gray") for r in rows], alpha=0.8,
            capsize=3, label="all workers (median, min-max)")
    worker = [(y, r["worker_ips"]) for y, r in zip(ys, rows) if r.get("worker_ips")]
    if worker:
        ax.plot([w for _, w in worker], [y for y, _ in worker], "k^", label="one worker")
    if model and model.get("ips"):
        ax.axvline(model["ips"], color="tab:red", linestyle="--",
                   label=f"model train step ({model['ips']:.4g} img/s)")
    ax.set_yticks(ys, labels)
    ax.invert_yaxis()
    ax.set_xlabel("images / s")
    ax.set_title(title, fontsize=9)
    for y, v in zip(ys, ips):
        if v:
            ax.annotate(f"{v:.4g}", (v, y), xytext=(3, 6), textcoords="offset points", fontsize=8)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    save_figure(fig, path)


def summary_markdown(rows: Sequence[Dict[str, Any]], model: Optional[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    table = list(rows) + ([model] if model else [])
    present = [c for c in COLUMNS if any(r.get(c) not in (None, "") for r in table)]
    features = f" (CPU {meta.get('cpu_name')}; {', '.join(meta['cpu_features'])})" if meta.get("cpu_features") \
        else ""
    parts = [f"Decode + augment ({meta['transform']}) at {meta['img_size']} px from copies of "
             f"{meta['images']} images stored at {meta['store_size'] or 'their own size'} px as {meta['format']}; "
             f"device {meta['device']}{features}, torch {meta['torch']}. ips: images/s of a whole pass, all workers "
             "(median over rounds, min-max beside it); worker_ips: one worker while it works; of_model: ips over the "
             "model's training throughput (< 1 starves it); first_pass_ips, first_batch_s: the pass that started the "
             "workers.", "", markdown_table(table, present)]
    spreads = {_label(r): relative_spread(r.get("ips_min"), r.get("ips_max"), r.get("ips")) for r in table
               if r.get("rounds", 1) > 1}
    warning = spread_warning(spreads)
    if warning:
        parts += ["", warning]
    if model and model.get("ips"):
        starving = [_label(r) for r in rows if r.get("starves")]
        parts += ["", f"The model trains at {model['ips']:.4g} images/s (batch {model['batch_size']}, "
                      f"{model['device']}); " + (f"these loaders are slower and starve it: {', '.join(starving)}."
                                                 if starving else "every loader measured keeps up with it.")]
    return "\n".join(parts)


def write_results(rows, model, out_dir: Path, meta: Dict[str, Any], stem: str = "bench_data") -> Dict[str, Path]:
    out_dir = Path(out_dir)
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("json", "csv", "md", "png")}
    table = list(rows) + ([model] if model else [])
    title = (f"{meta['img_size']} px {meta['format']}, batch {meta['batch_size']} · "
             f"{meta.get('cpu_name') or meta['cpu']}")
    write_result_files(paths["json"], meta, rows, model=model, table=table,
                       columns=COLUMNS,
                       markdown=summary_markdown(rows, model, meta) + "\n",
                       plot=lambda path: plot_results(rows, model, path, title))
    return paths


# ------------------------------------------------------------------------------------------------ CLI
def _options():
    from ..utils.recipe import Opt, check_path, maybe
    from .cli import shared, some_of
    return {
        "recipe": Opt("digits_cpu", "recipe (shipped name or YAML path) whose training transform and model are "
                                    "measured", check=check_path),
        "img_size": Opt(224, "input size of the transform and the model (N×N)", low=1),
        "store_size": Opt(None, "short side of the stored images in px (default: img_size / 0.875, as ImageNet's "
                                "resize; 0: as the source has them)", type=maybe(int), low=0),
        "dataset": Opt("digits", "source of the copies the bench writes (any --dataset of simattn train)"),
        "data_dir": Opt(None, "its root (not for digits)", type=maybe(str), check=check_path),
        "split": Opt("train", "split of the source, and of the copies"),
        "images": Opt(512, "images in each copy", low=1),
        "format": Opt("jpg", "encoding of the copies' images", choices=list(FORMATS)),
        "quality": Opt(90, "JPEG quality", low=1, high=100),
        "folder": Opt(None, "an existing image folder (root of <split>/<class>/<image>) instead of writing one",
                      type=maybe(str), check=check_path),
        "shards": Opt(None, "an existing shard folder (_info.json + <split>-NNNNNN.tar) instead of writing one",
                      type=maybe(str), check=check_path),
        "hfds": Opt(None, "an existing saved Hugging Face dataset instead of writing one", type=maybe(str),
                    check=check_path),
        "copies": Opt(None, "write the copies into this new or empty folder and keep them (default: a temporary "
                            "folder, removed at the end)", type=maybe(str), check=check_path),
        "readers": Opt(None, f"some of {', '.join(READERS)} (default: all; hfds when the datasets package is "
                             "installed)", type=maybe(List[str]), check=some_of(list(READERS))),
        "workers": Opt(None, "DataLoader worker counts to measure (0: in the main process; default: 0 and the CPU "
                             "count, at most 8)", type=maybe(List[int]), low=0),
        "batch_size": Opt(None, "batch of the loader and of the model's training step (default: the recipe's)",
                          type=maybe(int), low=1),
        "rounds": shared("rounds", 3, "passes over each copy (and model timings), interleaved; median reported "
                                      "with min and max"),
        "train_step": Opt(True, "also time the model's training step (--no-train-step: the loaders only)"),
        "device": shared("device", help="device of the model's training step"),
        "threads": shared("threads", help="CPU threads of the model's training step and of loading in the main "
                                          "process (workers use one each, as torch sets them)"),
        "repeats": shared("repeats", 5, "timed training steps per round"),
        "max_time": shared("max_time", 30.0),
        "timeout": shared("timeout", help="seconds before the model's worker process is abandoned"),
        "in_process": Opt(False, "time the model in this process (debugging)"),
        "seed": Opt(0, "seed of the loaders' shuffling", low=0),
        "output": shared("output", "runs/bench_data", "output folder"),
        "overwrite": shared("overwrite"),
    }


def build_parser() -> argparse.ArgumentParser:
    from ..utils.recipe import command_parser
    p = command_parser("simattn bench data",
                       "Decode + augment throughput of an image folder, tar shards and a saved Hugging Face dataset "
                       "of the same images, beside the model's training throughput.", _options())
    p.add_argument("--model-kwargs", nargs="*", default=[], metavar="KEY=VALUE",
                   help=f"create_model kwargs added to the recipe's, {OPTIONS_HELP}: e.g. patch_size=16")
    return p


def _has_datasets() -> bool:
    import importlib.util
    return importlib.util.find_spec("datasets") is not None


def _check_inputs(args) -> Tuple[List[str], Dict[str, Path]]:
    """The readers to measure and the existing copies given, with one-line errors before any work."""
    need = "dataset 'hfds' needs the Hugging Face datasets package (pip install 'simattn[hfds]')"
    note = None
    if args.readers is None:
        readers = [r for r in READERS if r != "hfds" or _has_datasets()]
        if "hfds" not in readers:
            note = f"note: hfds left out: {need}; measuring {', '.join(readers)}"
    else:
        readers = list(dict.fromkeys(args.readers))
        if "hfds" in readers and not _has_datasets():
            raise ValueError(f"--readers hfds: {need}")
    given = {}
    for reader in READERS:
        path = getattr(args, reader)
        if path is None:
            continue
        if reader not in readers:
            raise ValueError(f"--{reader} {quoted(path)} is not read: --readers leaves {reader} out")
        if not Path(path).is_dir():
            raise FileNotFoundError(f"--{reader} {quoted(path)}: folder not found")
        given[reader] = Path(path)
    if args.copies is not None:
        copies = Path(args.copies)
        if copies.exists() and (not copies.is_dir() or any(copies.iterdir())):
            raise ValueError(f"--copies {quoted(args.copies)} is not a new or empty folder")
        if len(given) == len(readers):
            raise ValueError("--copies: every reader has an existing copy (--folder/--shards/--hfds); nothing to "
                             "write")
    if len(given) < len(readers) and args.dataset not in DATASETS:
        raise ValueError(f"--dataset {quoted(args.dataset)}: unknown; known: {', '.join(DATASETS)}")
    if note:
        print(note, flush=True)
    return readers, given


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn bench data``."""
    from ..models.factory import parse_model_kwargs
    from ..classify.task import build_model
    from ..classify.transforms import build_transform, data_config_for
    from ..utils.timing import set_threads
    from ..classify import load_config

    args = build_parser().parse_args(argv)
    check_bench_flags(args, _options())
    args.output = Path(args.output)
    check_out(args.output, args.overwrite, result_files("bench_data"))
    require_cuda(args.device)
    if not args.train_step:
        refuse_unused(args, ["in_process", "timeout"], "to the model's training step, which --no-train-step leaves "
                                                        "out")
        if args.model_kwargs:
            raise ValueError("--model-kwargs applies to the model's training step, which --no-train-step leaves out")
    readers, given = _check_inputs(args)
    kwargs = parse_model_kwargs(args.model_kwargs)
    cfg = load_config(args.recipe, {"img_size": args.img_size, "model_kwargs": {**kwargs, "img_size": args.img_size},
                                    **({"batch_size": args.batch_size} if args.batch_size else {})})
    batch = cfg.batch_size
    store = round(args.img_size / 0.875) if args.store_size is None else args.store_size
    cpus = os.cpu_count() or 1
    workers = list(dict.fromkeys(args.workers if args.workers is not None else [0, min(cpus, 8)]))
    previous = torch.get_num_threads()
    threads = set_threads(args.threads)
    work = Path(args.copies) if args.copies else Path(tempfile.mkdtemp(prefix="simattn_bench_data_"))
    try:
        copies = dict(given)
        to_write = [r for r in readers if r not in given]
        classes: List[str] = []
        if to_write:
            source = create_dataset(args.dataset, args.data_dir, args.split)
            if len(source) == 0:
                raise ValueError(f"--dataset {args.dataset} ({args.split}) has no images")
            print(f"writing {', '.join(to_write)} copies of {args.images} {args.dataset} images ({args.split}) at "
                  f"{store or 'their own size'} px as {args.format} into {work}", flush=True)
            classes, samples = source_samples(source, args.images, store, args.format, args.quality)
            copies.update(build_copies(samples, classes, work, args.split, args.format, args.dataset, to_write,
                                       max(workers)))
        copies = {r: copies[r] for r in readers}
        # the model fixes the transform's preprocessing (mean, std, interpolation) as in training
        num_classes = len(classes) or len(open_copy(readers[0], copies[readers[0]], args.split, None).classes)
        model, _ = build_model(cfg, num_classes)
        data_config = data_config_for(model, cfg)
        del model
        transform = build_transform(data_config, cfg, is_training=True)
        meta = {**machine_info(args.device, threads), "recipe": args.recipe, "img_size": args.img_size,
                "store_size": store, "format": args.format, "images": args.images, "batch_size": batch,
                "workers": workers, "rounds": args.rounds, "readers": readers, "cpu_count": cpus,
                "copies": {r: str(p) for r, p in copies.items()}, "transform": _describe(transform),
                "command": "simattn bench data " + " ".join(argv if argv is not None else sys.argv[1:])}
        print(f"simattn bench data: {', '.join(readers)} x workers {', '.join(map(str, workers))}, batch {batch}, "
              f"{args.rounds} round(s); CPU {meta.get('cpu_name') or meta['cpu']} ({cpus} cores), features: "
              f"{', '.join(meta.get('cpu_features') or ['unknown'])}", flush=True)
        rows = run_loaders(copies, args.split, transform, batch, workers, args.rounds, args.seed)
        model_result = None
        if args.train_step:
            model_result = model_row(cfg, args.img_size, batch, args.device, threads, args.rounds, args.repeats,
                                     args.max_time, args.in_process, args.timeout)
            if model_result.get("ips"):
                for row in rows:
                    if row.get("ips"):
                        row["of_model"] = row["ips"] / model_result["ips"]
                        row["starves"] = row["ips"] < model_result["ips"]
        paths = write_results(rows, model_result, args.output, meta)
    finally:
        torch.set_num_threads(previous)
        if not args.copies:
            shutil.rmtree(work, ignore_errors=True)
    print(summary_markdown(rows, model_result, meta))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if model_result is not None and "error" in model_result else 0


def _describe(transform) -> str:
    """The transform's steps by class name (``RandomResizedCropAndInterpolation → ... → Normalize``)."""
    steps = getattr(transform, "transforms", None)
    return " → ".join(type(t).__name__ for t in steps) if steps else type(transform).__name__


if __name__ == "__main__":
    sys.exit(main())
