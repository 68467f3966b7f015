"""webdataset shards (``--dataset wds``): the reader gives the source's samples, tasks train and validate on shards
(a folder, a brace pattern, a ``pipe:`` URL), ranks and workers read distinct shards in a seeded per-epoch order,
and bad shards are one-line errors."""
from __future__ import annotations

import collections
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_inputs import FLAGS, one_line_error
from shard_fixtures import digits_samples, png_bytes, write_broken_split, write_digits, write_numbered, \
    write_split
from simattn.cli import main as simattn_main
from simattn.data.factory import create_dataset
from simattn.data.shards import shard_slots
from torchrun import run_two_processes

TRAIN = [f for f in FLAGS]


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory) -> Path:
    return write_digits(tmp_path_factory.mktemp("digits_wds"), shard_samples=200)


def _pixels(item):
    image, label = item
    return np.asarray(image)[:, :, 0].tobytes(), label


def test_shards_hold_the_source_samples(digits_shards):
    for split in ("train", "val"):
        data = create_dataset("wds", digits_shards, split)
        assert data.classes == [str(i) for i in range(10)] and len(data) == len(digits_samples(split)[1])
        assert collections.Counter(map(_pixels, data)) == collections.Counter(digits_samples(split)[1])
    # a pipe: URL of the train shards reads them, and the val split through the same command
    pattern = f"pipe:cat {digits_shards}/train-{{000000..000007}}.tar"
    train = create_dataset("wds", pattern, "train")
    assert train.urls[0] == f"pipe:cat {digits_shards}/train-000000.tar"
    assert collections.Counter(map(_pixels, train)) == collections.Counter(digits_samples("train")[1])
    val = create_dataset("wds", pattern, "val")
    assert len(val.urls) == 2 and sum(1 for _ in val) == 359
    # a brace pattern naming some shards reads those
    some = create_dataset("wds", f"{digits_shards}/train-{{000001..000002}}.tar", "train")
    assert len(some) == 400 and sum(1 for _ in some) == 400


def test_train_and_validate_read_shards(digits_shards, tmp_path, capsys):
    out = tmp_path / "run"
    code = simattn_main(["train", "-c", "digits_cpu", *TRAIN, "--dataset", "wds", "--data-dir", str(digits_shards),
                         "--workers", "2", "--output", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["final"]["samples"] == 359
    assert "do not split evenly" not in capsys.readouterr().out  # 8 shards over 2 workers
    pattern = f"pipe:cat {digits_shards}/val-{{000000..000001}}.tar"
    code = simattn_main(["validate", "--weights", str(out / "final.safetensors"), "--dataset", "wds",
                         "--data-dir", pattern, "--device", "cpu", "--workers", "2"])
    text = capsys.readouterr().out
    assert code == 0 and "359" in text


def test_shard_order_is_drawn_from_seed_and_epoch():
    a = shard_slots(7, 2, 2, seed=3, epoch=1, shuffle=True)
    assert a == shard_slots(7, 2, 2, seed=3, epoch=1, shuffle=True)
    assert a != shard_slots(7, 2, 2, seed=3, epoch=2, shuffle=True)
    assert a != shard_slots(7, 2, 2, seed=4, epoch=1, shuffle=True)
    flat = sorted(s for rank in a for slot in rank for s in slot)
    assert flat == list(range(7))  # every shard once, one (rank, worker) each
    assert [sum(map(len, rank)) for rank in a] == [4, 3]
    assert shard_slots(4, 1, 1, 0, 5, shuffle=False) == [[[0, 1, 2, 3]]]


DDP_WORKER = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from simattn.data.factory import create_dataset
    from simattn.engine.config import EngineConfig
    from simattn.engine.data import build_train_loader
    from simattn.engine.dist import init_distributed
    info = init_distributed("cpu")
    seen = {}
    for name, batch in (("odd", 3), ("even", 5)):
        data = create_dataset("wds", os.path.join(sys.argv[1], name), "train",
                              transform=lambda img: int(img.getpixel((0, 0))[0]))
        cfg = EngineConfig(batch_size=batch, workers=2, seed=11, device="cpu")
        loader, epochs = build_train_loader(data, cfg, info)
        for epoch in range(2):
            epochs.set_epoch(epoch)
            ids = []
            for i, (x, y, skipped) in enumerate(loader):
                if i >= len(loader):
                    break
                ids.extend(x.tolist())
            gathered = [None] * info.world_size
            dist.all_gather_object(gathered, {"ids": ids, "steps": min(i + 1, len(loader)), "len": len(loader)})
            seen[f"{name}{epoch}"] = gathered
    if info.rank == 0:
        json.dump(seen, open(sys.argv[2], "w"))
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_two_processes_by_two_workers_read_distinct_shards(tmp_path):
    write_numbered(tmp_path / "odd", "train", [10] * 6 + [7])   # 7 shards over 2 x 2: uneven
    write_numbered(tmp_path / "even", "train", [10] * 8)        # 8 shards: every sample once
    proc = run_two_processes(tmp_path, DDP_WORKER, [tmp_path, tmp_path / "seen.json"], timeout=300)
    seen = json.loads((tmp_path / "seen.json").read_text())
    notes = [line for line in proc.stdout.splitlines() if "do not split evenly" in line]
    # the uneven set says so once (rank 0 only), naming the rank that reads more
    assert len(notes) == 1 and "7 shards" in notes[0] and "rank(s) 0 read 4 shards and the others 3" in notes[0]
    for name, total in (("odd", 67), ("even", 80)):
        orders = []
        for epoch in range(2):
            ranks = seen[f"{name}{epoch}"]
            assert ranks[0]["steps"] == ranks[1]["steps"] == ranks[0]["len"]  # the ranks step together
            a, b = (collections.Counter(r["ids"]) for r in ranks)
            assert max(a.values()) == 1 and max(b.values()) == 1 and not set(a) & set(b)  # disjoint, none twice
            if name == "even":
                assert set(a) | set(b) == set(range(total))  # complete
            orders.append(ranks[0]["ids"])
        assert orders[0] != orders[1]  # the shards are shuffled per epoch (persistent workers see the epoch)


def _run_train(data_dir: str, tmp_path: Path, capsys, *extra: str) -> str:
    out = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"  # a failed run keeps its folder
    code = simattn_main(["train", *TRAIN, "--dataset", "wds", "--data-dir", data_dir, "--output", str(out), *extra])
    return one_line_error(capsys, code)


def _small(folder: Path, samples, split: str = "train", broken: bool = False):
    """``samples`` as ``split`` and 16 digits as the other split; ``broken``: samples the pack writer refuses."""
    (write_broken_split if broken else write_split)(folder, split, samples, 8, [str(i) for i in range(10)])
    other = "val" if split == "train" else "train"
    write_split(folder, other, digits_samples(other, 16)[0], 8, [str(i) for i in range(10)])
    return folder


def test_bad_shards_are_one_line_errors(tmp_path, capsys):
    good = digits_samples("train", 24)[0]
    # a truncated tar: found when the folder is opened, and when streamed through a pipe (in a worker)
    cut = _small(tmp_path / "cut", good)
    shard = cut / "train-000001.tar"
    shard.write_bytes(shard.read_bytes()[:3000])
    assert "train-000001.tar is truncated" in _run_train(str(cut), tmp_path, capsys)
    err = _run_train(f"pipe:cat {cut}/train-{{000000..000002}}.tar", tmp_path, capsys, "--workers", "1")
    assert "shard train-000001.tar cannot be read" in err and "truncated" in err
    # a sample with an image and no label
    unlabelled = [dict(s) for s in good]
    del unlabelled[9]["cls"]
    err = _run_train(str(_small(tmp_path / "nolabel", unlabelled, broken=True)), tmp_path, capsys)
    assert "shard train-000001.tar: sample 00000009 has an image and no label" in err
    # a label outside the classes
    wrong = [dict(s) for s in good]
    wrong[3]["cls"] = b"12"
    err = _run_train(str(_small(tmp_path / "label", wrong, broken=True)), tmp_path, capsys, "--workers", "2")
    assert "sample 00000003 has label 12, outside the 10 classes" in err
    # _info.json counts that disagree with the shards
    for delta, said in ((1, "holds 8 samples but _info.json records 9"), (-1, "holds more samples than the 7")):
        folder = _small(tmp_path / f"count{delta}", good)
        info = json.loads((folder / "_info.json").read_text())
        info["splits"]["val"]["shard_lengths"][1] += delta
        info["splits"]["val"]["num_samples"] += delta
        (folder / "_info.json").write_text(json.dumps(info))
        err = _run_train(str(folder), tmp_path, capsys)
        assert f"shard val-000001.tar {said}" in err
    # an empty pattern, a pattern that names no packed shard, a folder without _info.json
    assert "empty path" in _run_train("", tmp_path, capsys)
    err = _run_train(f"{cut}/train-{{000007..000009}}.tar", tmp_path, capsys)
    assert "shard train-000007.tar is not listed in" in err
    assert "no _info.json next to the shards" in _run_train(str(tmp_path), tmp_path, capsys)
    with pytest.raises(ValueError, match="a pipe: URL must name its shard"):
        create_dataset("wds", "pipe:cat {}".format("{,}"), "train")
    with pytest.raises(ValueError, match="not a shard pattern"):
        create_dataset("wds", f"{cut}/train-{{000000..000002.tar", "train")


def test_ssl_pretrains_and_evaluates_on_shards(digits_shards, tmp_path, capsys):
    code = simattn_main(["ssl", "train", "--config", "configs/ssl_digits.yaml", "--output", str(tmp_path / "run"),
                         "--set", "data.name=wds", f"data.root={digits_shards}", "epochs=1", "steps_per_epoch=2",
                         "batch_size=64", "threads=1", "device=cpu", "workers=2", "eval.compare_random_init=false",
                         "eval.linear_epochs=0", "model.kwargs.depth=1"])
    assert code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["final"]["knn_top1"] > 0


@pytest.mark.slow
def test_segment_trains_and_evaluates_on_shards(tmp_path, capsys):
    from simattn.data.segmentation import DigitScenes
    for split, n in (("train", 24), ("val", 6)):
        scenes = DigitScenes(split, num_train=24, num_val=6, canvas=64)
        samples = [{"png": png_bytes(scenes.scene_images[i]), "mask.png": png_bytes(scenes.scene_masks[i])}
                   for i in range(n)]
        write_split(tmp_path / "seg", split, samples, 8, scenes.classes, task="segmentation",
                    extra={"ignore_index": 255, "palette": [list(c) for c in scenes.palette]})
    from simattn.data.segmentation import create_segmentation_dataset
    val = create_segmentation_dataset("wds", tmp_path / "seg", "val", scale=(64, 64))
    assert val.classes == list(scenes.classes) and val.ignore_index == 255 and len(val) == 6
    pairs = list(val)
    assert len(pairs) == 6 and pairs[0][0].shape == (3, 64, 64) and pairs[0][1].dtype.is_floating_point is False
    flags = ["--model", "semantic_fpn", "--model-kwargs", "backbone=sima_deit_tiny_patch16_224", "img_size=64",
             "patch_size=16", "embed_dim=32", "depth=4", "num_heads=2", "decoder_channels=16",
             "segmentation_channels=32", "--dataset", "wds", "--data-dir", str(tmp_path / "seg"),
             "--crop-size", "[64, 64]", "--img-scale", "[64, 64]", "--batch-size", "4", "--workers", "2",
             "--threads", "1", "--device", "cpu", "--epochs", "1", "--warmup-epochs", "0", "--output",
             str(tmp_path / "run")]
    code = simattn_main(["segment", *flags])
    assert code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # 3 shards of 8 over 2 workers: 16 + 8 samples, 4 + 2 batches of 4
    assert summary["updates"] == 6 and "val_miou" in summary["history"][-1]


IMAGENET_LENGTHS = [1252] * 1023 + [371]  # 1,281,167 images packed 1252 a shard


def _ideal_steps(lengths, world, workers, batch, seed, epochs):
    """The most steps all ranks could run without reading a sample twice, even if batches could mix the workers'
    streams: the fewest samples any rank holds in any epoch, in whole batches."""
    lengths = np.asarray(lengths)
    return min(sum(int(lengths[slot].sum()) for slot in rank) // batch
               for epoch in range(epochs) for rank in shard_slots(len(lengths), world, workers, seed, epoch, True))


def test_shard_steps_use_what_the_epochs_shard_order_gives():
    from simattn.engine.data import shard_steps
    assert sum(IMAGENET_LENGTHS) == 1_281_167
    world, workers, batch = 16, 8, 128
    steps, used, note = shard_steps(IMAGENET_LENGTHS, world, workers, batch, seed=0, epochs=5,
                                    requested_workers=workers)
    # one worker stream per epoch holds the short shard: 371 + 7 × 1252 samples = 71 batches, the other 127
    # streams 8 × 1252 = 78; its rank gives 71 + 7 × 78 = 617 batches, the others 624
    assert steps == 617 and used == 617 * batch * world == 1_263_616
    # the bound asserted: at most workers - 1 steps below the ideal (619 here), as each of a rank's worker streams
    # drops less than one batch; a count that assumes every stream gets the shortest shards at once (568) fails it
    ideal = _ideal_steps(IMAGENET_LENGTHS, world, workers, batch, 0, 5)
    assert ideal == 619 and ideal - (workers - 1) <= steps <= ideal
    assert note is not None and len(note.splitlines()) == 1
    assert "1,281,167 samples" in note and "uses 1,263,616 and leaves 17,551 out" in note
    assert "the last shard is short (371 samples" in note
    # random shard lengths: the bound holds for every run length, and the note appears exactly when samples are
    # left out
    rng = np.random.default_rng(0)
    for trial in range(12):
        lengths = rng.integers(5, 40, int(rng.integers(4, 30))).tolist()
        world, workers, batch = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
        epochs = int(rng.integers(1, 4))
        steps, used, note = shard_steps(lengths, world, workers, batch, seed=trial, epochs=epochs)
        ideal = _ideal_steps(lengths, world, workers, batch, trial, epochs)
        assert ideal - (workers - 1) <= steps <= ideal and used == steps * batch * world <= sum(lengths)
        assert (note is None) == (used == sum(lengths))
    # equal shards that split evenly in whole batches: nothing left out, no note
    assert shard_steps([1280] * 1024, 16, 8, 128, seed=0, epochs=3) == (640, 1_310_720, None)
    # the same shards with the ImageNet-like short last one over 16 × 8 streams: a note though 1024 splits evenly
    assert shard_steps([1280] * 1023 + [371], 16, 8, 128, seed=0, epochs=3)[2] is not None


class _RecordedShards(torch.utils.data.IterableDataset):
    """Only what the engine reads before streaming: the shard URLs and their recorded lengths."""

    def __init__(self, lengths):
        self.lengths, self.urls = list(lengths), [f"train-{i:06d}.tar" for i in range(len(lengths))]

    def __len__(self):
        return sum(self.lengths)

    def configure(self, *args, **kwargs):
        return self

    def __iter__(self):
        raise AssertionError("not read")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_engine_steps_and_note_on_imagenet_like_shards(capsys):
    from simattn.engine.config import EngineConfig
    from simattn.engine.data import build_train_loader
    from simattn.engine.dist import DistInfo
    cfg = EngineConfig(batch_size=128, workers=8, seed=0, epochs=3, device="cpu")
    for rank in (0, 5):  # every rank computes the same count; only rank 0 prints
        loader, _ = build_train_loader(_RecordedShards(IMAGENET_LENGTHS), cfg, DistInfo(rank=rank, world_size=16))
        assert len(loader) == 617
    notes = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(notes) == 1 and "leaves 17,551 out" in notes[0] and "16 process(es) × 8 worker(s)" in notes[0]
    loader, _ = build_train_loader(_RecordedShards([1280] * 1024), cfg, DistInfo(rank=0, world_size=16))
    assert len(loader) == 640 and capsys.readouterr().out == ""


def test_training_streams_shuffle_samples_within_a_shard(tmp_path):
    # One shard: shuffling shards alone would replay the packed order every epoch. The training stream's order must
    # change between epochs, be the same for the same (seed, epoch), and still hold every sample once.
    write_numbered(tmp_path, "train", [40])
    data = create_dataset("wds", str(tmp_path), "train")
    data.configure(seed=3, shuffle=True)

    def order(epoch):
        data.set_epoch(epoch)
        return [int(np.asarray(image)[0, 0, 0]) for image, _ in data]

    first, again, second = order(0), order(0), order(1)
    assert sorted(first) == list(range(40)) and sorted(second) == list(range(40))
    assert first == again
    assert first != list(range(40)) and second != first
    data.configure(seed=3, shuffle=False)  # evaluation streams keep the packed order
    assert order(0) == list(range(40))
