"""Every released Tiny model here beside its authors' own code, on this CPU: same weights file, one thread, side by side.

The authors' repositories are read from a local folder (nothing is fetched): ``REPOS/<owner>+<name>/repo`` git
directories (as the ``fetch`` tool leaves them) or plain checkouts ``REPOS/<name>``. Each is extracted into a temporary
folder (``git archive``), its model files imported module by module under private package names (their
``models/__init__.py`` never runs, timm's ``register_model`` is neutralised meanwhile so their names never shadow
simattn's), and each released Tiny model built as their training configs build it. One seeded random state dict in
their layout is saved as their training script saves it (``{'model': ...}``) and loaded by both sides: theirs strictly,
simattn's through ``create_model(tag, pretrained=True, pretrained_cfg_overlay=dict(file=F))``.

Timed, per model, on one thread with the two sides alternated (order swapped every round): the batch-1 forward, the
batch-8 forward (eval, no grad) and the batch-8 training step (train mode, forward, cross-entropy, backward, SGD step).
Printed and written: each side's median seconds and the median of the per-round ratios simattn/authors with its
p10-p90, and the largest logit difference (eval, batch 2), and of the training loss, between the sides.

Needs einops (the authors' code imports it): ``pip install --target DIR einops`` and ``--site DIR`` if not installed.

Usage:
    PYTHONPATH=src .venv/bin/python scripts/against_authors.py /work/.mirror [--models inline_deit,agent_pvt]
        [--rounds 9] [--modes fwd1,fwd8,train8] [--output against_authors.json] [--site /tmp/pylib]
"""
import argparse
import contextlib
import csv
import importlib
import importlib.util
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

REPOS = dict(agent="LeapLabTHU+Agent-Attention", inline="LeapLabTHU+InLine", pola="ZacharyMeng+PolaFormer",
             flatten="LeapLabTHU+FLatten-Transformer", slab="xinghaochen+SLAB")
#: the folder of each repository that holds ``models/``
MODEL_ROOTS = dict(agent="agent_transformer", inline="", pola="", flatten="", slab="classification")


def _swin(module, cls, **kind):
    """Their Swin-T as cfgs/*_swin_t.yaml builds it (224 px: window 56 in the linear stages)."""
    return lambda a: getattr(a.module(module), cls)(
        img_size=224, patch_size=4, in_chans=3, num_classes=1000, embed_dim=96, depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24], window_size=56, mlp_ratio=4., qkv_bias=True, qk_scale=None, drop_rate=0.,
        drop_path_rate=0., ape=False, patch_norm=True, use_checkpoint=False, **kind)


def _pvt(module, fn, **kind):
    return lambda a: getattr(a.module(module), fn)(drop_path_rate=0., la_sr_ratios="1111", **kind)


def _deit(module, cls, **kind):
    return lambda a: getattr(a.module(module), cls)(patch_size=16, embed_dim=192, depth=12, img_size=224,
                                                     drop_path_rate=0., representation_size=None, **kind)


#: case → (repository, simattn tag, the authors' builder)
CASES = {
    "agent_deit": ("agent", "agent_deit_tiny_patch16_224.in1k",
                   _deit("agent_deit", "VisionTransformer", num_heads=3, agent_num=["49"] * 4)),
    "inline_deit": ("inline", "inline_deit_tiny_patch16_224.in1k",
                    _deit("inline_deit", "VisionTransformer", num_heads=6)),
    "slab_deit": ("slab", "slab_deit_tiny_patch16_224.in1k",
                  lambda a: a.module("slab_deit").deit_tiny_patch16_224_linear_repbn(drop_path_rate=0.)),
    "agent_pvt": ("agent", "agent_pvt_tiny.in1k",
                  lambda a: a.module("agent_pvt").agent_pvt_tiny(drop_path_rate=0., agent_num="9-16-49-49".split("-"),
                                                                 attn_type="AAAA", agent_sr_ratios="1111")),
    "inline_pvt": ("inline", "inline_pvt_tiny.in1k", _pvt("inline_pvt", "inline_pvt_tiny", attn_type="IIII")),
    "flatten_pvt": ("flatten", "flatten_pvt_tiny.in1k",
                    _pvt("flatten_pvt", "flatten_pvt_tiny", focusing_factor=3, kernel_size=5, attn_type="LLLL")),
    "slab_pvt": ("slab", "slab_pvt_tiny.in1k",
                 _pvt("slab_pvt", "slab_pvt_tiny", focusing_factor=3, kernel_size=5, attn_type="LLLL")),
    "pola_pvt": ("pola", "polaformer_pvt_tiny.in1k",
                 _pvt("pola_pvt", "pola_pvt_tiny", alpha=4, kernel_size=5, attn_type="LLLL")),
    "agent_swin": ("agent", "agent_swin_tiny_patch4_window7_224.in1k",
                   _swin("agent_swin", "AgentSwinTransformer", agent_num="9-16-49-49".split("-"), attn_type="AAAB")),
    "inline_swin": ("inline", "inline_swin_tiny_patch4_window7_224.in1k",
                    _swin("inline_swin", "InLineSwin", attn_type="IIIS")),
    "flatten_swin": ("flatten", "flatten_swin_tiny_patch4_window7_224.in1k",
                     _swin("flatten_swin", "FLattenSwinTransformer", focusing_factor=3, kernel_size=5,
                           attn_type="LLSS")),
    "slab_swin": ("slab", "slab_swin_tiny_patch4_window7_224.in1k",
                  _swin("slab_swin", "SlabSwinTransformer", focusing_factor=3, kernel_size=5, attn_type="LLSS")),
    "pola_swin": ("pola", "polaformer_swin_tiny_patch4_window7_224.in1k",
                  _swin("pola_swin", "PolaSwinTransformer", alpha=4, kernel_size=5, attn_type="LLSS")),
}
MODES = ("fwd1", "fwd8", "train8")


class Authors:
    """One authors' repository, extracted into ``root``, its model files importable as ``authors_<repo>.<file>``."""

    def __init__(self, repo: str, repos: Path, root: Path):
        self.repo = repo
        git_dir, plain = repos / REPOS[repo] / "repo", repos / REPOS[repo].split("+")[1]
        if git_dir.is_dir():
            dest = root / repo
            dest.mkdir()
            archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "HEAD"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        elif plain.is_dir():
            dest = plain
        else:
            sys.exit(f"error: no {git_dir} nor {plain}: bring the authors' repository there first")
        self.models = dest / MODEL_ROOTS[repo] / "models"

    def module(self, name: str):
        import timm.models
        import timm.models._registry as registry

        package = f"authors_{self.repo}"
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = [str(self.models)]
            sys.modules[package] = stub
        if self.repo == "slab":  # slab_*.py import `models.prepbn`; only SLAB's code runs under that name
            stub = types.ModuleType("models")
            stub.__path__ = [str(self.models)]
            sys.modules["models"] = stub
        keep = (registry.register_model, timm.models.register_model)
        registry.register_model = timm.models.register_model = lambda fn: fn
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return importlib.import_module(f"{package}.{name}")
        finally:
            registry.register_model, timm.models.register_model = keep


def random_state(model, seed=0):
    """Seeded random tensors in the model's own layout: structural buffers (indices, masks, coordinate tables) as
    built; counters as small positive integers."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, value in model.state_dict().items():
        if any(s in key for s in ("relative_position_index", "attn_mask", "relative_coords_table")):
            out[key] = value.clone()
        elif value.is_floating_point():
            out[key] = (torch.rand(value.shape, generator=gen) + 0.5 if key.endswith("running_var")
                        else torch.randn(value.shape, generator=gen) * 0.02)
        else:
            out[key] = torch.randint(1, 8, value.shape, generator=gen, dtype=value.dtype)
    return out


def build_pair(case, authors, folder):
    import torch
    import simattn.models

    repo, tag, build = CASES[case]
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = build(authors[repo])
    state = random_state(theirs)
    theirs.load_state_dict(state, strict=True)
    path = folder / f"{case}.pth"
    torch.save({"model": state}, path)
    ours = simattn.models.create_model(tag, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                                       drop_path_rate=0.)
    return theirs, ours


def step_fns(model, mode, images, labels):
    import torch
    import torch.nn.functional as F

    if mode.startswith("fwd"):
        model.eval()

        def run():
            with torch.no_grad():
                return model(images)
        return run
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

    def run():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        return loss
    return run


def timed(fn, calls):
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


def percentile(values, q):
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def compare(case, theirs, ours, modes, rounds, target_s):
    """The agreement and the timings of one model, as rows."""
    import torch

    gen = torch.Generator().manual_seed(1)
    images = torch.randn(8, 3, 224, 224, generator=gen)
    labels = torch.randint(0, 1000, (8,), generator=gen)
    theirs.eval(), ours.eval()
    with torch.no_grad():
        dlogit = (theirs(images[:2]) - ours(images[:2])).abs().max().item()
    rows = []
    for mode in modes:
        batch = images[:1] if mode == "fwd1" else images
        fns = {"authors": step_fns(theirs, mode, batch, labels[:len(batch)]),
               "simattn": step_fns(ours, mode, batch, labels[:len(batch)])}
        first = {side: fn().item() if mode == "train8" else None for side, fn in fns.items()}
        warm = max(timed(fns["authors"], 1), timed(fns["simattn"], 1))
        calls = max(1, round(target_s / warm))
        times = {"authors": [], "simattn": []}
        for r in range(rounds):
            for side in (("authors", "simattn") if r % 2 == 0 else ("simattn", "authors")):
                times[side].append(timed(fns[side], calls))
        ratios = [s / a for s, a in zip(times["simattn"], times["authors"])]
        row = dict(model=case, tag=CASES[case][1], mode=mode, rounds=rounds, calls=calls,
                   authors_ms=1e3 * statistics.median(times["authors"]),
                   simattn_ms=1e3 * statistics.median(times["simattn"]),
                   ratio=statistics.median(ratios), ratio_p10=percentile(ratios, 0.1),
                   ratio_p90=percentile(ratios, 0.9), max_abs_dlogit=dlogit,
                   abs_dloss=abs(first["authors"] - first["simattn"]) if mode == "train8" else None)
        rows.append(row)
        print(f"{case:13s} {mode:6s} authors {row['authors_ms']:9.1f} ms  simattn {row['simattn_ms']:9.1f} ms  "
              f"ratio {row['ratio']:.3f} [{row['ratio_p10']:.3f}, {row['ratio_p90']:.3f}]  "
              f"dlogit {dlogit:.1e}" + (f"  dloss {row['abs_dloss']:.1e}" if mode == "train8" else ""), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", type=Path, help="folder holding the authors' repositories (module docstring)")
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--target-s", type=float, default=0.3, help="seconds per timed batch of calls (at least one)")
    parser.add_argument("--output", type=Path, default=Path("against_authors.json"),
                        help="JSON written here, its CSV beside it")
    parser.add_argument("--site", type=Path, help="a folder with einops (pip install --target), put on the path")
    args = parser.parse_args(argv)
    cases, modes = args.models.split(","), args.modes.split(",")
    bad = [c for c in cases if c not in CASES] + [m for m in modes if m not in MODES]
    if bad or args.rounds < 2 or not args.repos.is_dir():
        parser.exit(2, f"error: unknown model or mode {bad}, rounds under 2 or no folder {args.repos}\n"
                       if bad or args.rounds < 2 else f"error: no folder {args.repos}\n")
    if args.site:
        sys.path.insert(0, str(args.site))
    if importlib.util.find_spec("einops") is None:
        parser.exit(2, "error: einops is not installed: pip install --target DIR einops, then pass --site DIR\n")
    warnings.simplefilter("ignore", FutureWarning)  # their torch.cuda.amp.autocast, deprecated, once per call
    import torch

    torch.set_num_threads(1)
    import simattn  # noqa: F401  (its models registered before any of the authors' files is imported)
    from simattn.utils.io import atomic_write_json, atomic_write_text

    rows = []
    with tempfile.TemporaryDirectory(prefix="against_authors_") as tmp:
        root = Path(tmp)
        authors = {repo: Authors(repo, args.repos, root) for repo in sorted({CASES[c][0] for c in cases})}
        for case in cases:
            theirs, ours = build_pair(case, authors, root)
            rows += compare(case, theirs, ours, modes, args.rounds, args.target_s)
            del theirs, ours
    meta = dict(threads=1, rounds=args.rounds, target_s=args.target_s, torch=torch.__version__,
                command=" ".join(sys.argv))
    notes = ["ratio: median over rounds of simattn/authors within a round (sides alternated, order swapped every "
             "round); p10-p90 its spread", "max_abs_dlogit: eval logits on the same two images, same weights file"]
    atomic_write_json(dict(meta=meta, rows=rows, notes=notes), args.output)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(text.getvalue(), args.output.with_suffix(".csv"))
    print(f"wrote {args.output} and {args.output.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
