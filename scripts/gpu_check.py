"""The GPU check for a short loan, in two runs of at most 270 s each (stage limits summed below), with the Triton
kernels compiled ahead on a CPU machine and carried (``scripts/triton_compile_ahead.py`` writes ``.triton_sm90/``).

Run 1 (limits: 10 + 60 + 40 + 60 + 100 = 270 s): the carried kernels (their cache relocated to this checkout and
its key checked against this machine's Triton), SimA's op sweep at the acceptance grid (bf16, H 6, d 64, B 128 and
8, N 197 577 1025 4097 16385, forward and forward+backward, SimA torch and Triton against SDPA flash, eager and from
CUDA graphs, % HBM; SimA's backend table for this GPU), the newer kinds against flash at B 128 (with
``scripts/gpu_peers_check.py``'s verdicts), then the CUDA tests beside ``scripts/gpu_compile_check.py`` (a SimA
DeiT-S under ``torch.compile(fullgraph=True)`` against eager) and beside one short compiled run of each compiled
model row into inductor's on-disk caches (which run 2 finds when it lands on the same warm machine).

Run 2 (limits: 10 + 110 + 55 + 45 + 50 = 270 s): the model rows (training images/s, bf16 autocast, AdamW): DeiT-S
eager at 224 px batch 256, 512 px batch 64, 1024 px batch 16 (SimA as ``auto`` picks it, SimA on the Triton
kernels, softmax, the attention-free floor), compiled at 224 px in the default mode and in reduce-overhead (CUDA
graphs; SimA, softmax), and a Semantic FPN at 1024x2048 batch 8 (SimA and its floor), with
``scripts/gpu_model_check.py``'s verdicts.

Each stage has its own limit (its processes are killed past it) and writes its figures to ``$OUT`` as it finishes,
so a run cut short still brings back what it measured: run 1 writes summary.txt, logs.txt, attention_b128.json,
attention_b8.json, attention_peers_b128.json, sima_gpu_table.json (copy it to src/simattn/attention/ to let backend
'auto' use it) and compile_check.json; run 2 summary.txt, logs.txt and one model_<stage>.tgz per model stage (a
``bench model`` folder). At most 8 files each, none in a folder: what a device loan brings back.

It runs on the machine's python3 (torch, Triton, timm) with ``src`` on PYTHONPATH and ``TRITON_CACHE_DIR`` at the
carried ``.triton_sm90``; run 2 installs only the wheels ``scripts/gpu_wheels.sh`` put in ``.whl``
(segmentation_models_pytorch, for the FPN rows). ``--dry-run`` walks every stage without a GPU: the order, the
limits, each stage's commands (stand-ins that print them run through the same stage runner, into $OUT's summary.txt
and logs.txt); ``--kernels`` adds, for the stages that launch Triton kernels, the launches they will ask for
(listed under the kernels' dry run on meta tensors), against the carried cache's manifest where there is one.

Usage, from the repo root:
    OUT=folder python3 scripts/gpu_check.py --run 1      (then --run 2; default folder runs/gpu_check)
    OUT=/tmp/dry python3 scripts/gpu_check.py --run 1 --dry-run [--kernels]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
#: what one run may take on the device, all its stage limits together
RUN_LIMIT_S = 270
#: the carried Triton cache (``scripts/triton_compile_ahead.py`` writes it; ignored by git, named in ``carry``)
CACHE = ".triton_sm90"
#: where the model stages write their ``bench model`` folders (packed into $OUT one by one, read by the verdicts)
MODEL_DIR = "/tmp/simattn_gpu_model"

HEADS, HEAD_DIM, DTYPE = 6, 64, "bfloat16"
SWEEP_TOKENS = (197, 577, 1025, 4097, 16385)
SWEEP_KINDS = ("sima", "sima_triton", "sdpa_flash")
PEER_TOKENS = (197, 577, 1025, 4097)
PEER_KINDS = ("sdpa_flash", "slab_triton", "flatten_triton", "inline_triton", "polaformer_triton", "sigmoid_triton",
              "relu_triton", "agent", "agent_triton")
#: (batch, tokens, kinds, repeats) of each sweep; the backend table comes from the first two
SWEEPS = ((128, SWEEP_TOKENS, SWEEP_KINDS, 20), (8, SWEEP_TOKENS, SWEEP_KINDS, 20), (128, PEER_TOKENS, PEER_KINDS, 10))
DEIT = "sima_deit_small_patch16_224"
#: DeiT-S eager rows: (image side, batch)
DEIT_SIZES = ((224, 256), (512, 64), (1024, 16))
COMPILED = (224, 256)  # the compiled rows' size and batch
FPN = ("1024x2048", 8)
COMPILE_CHECK_BATCH = 64  # scripts/gpu_compile_check.py's default, at 224 px


@dataclass
class Stage:
    """One stage: ``commands`` run side by side, all killed at ``limit`` s; then ``figures`` (files of the stage's
    results) are moved or packed into $OUT. ``kernels``: what it launches through Triton, for the listing."""
    name: str
    limit: int
    commands: List[List[str]]
    kernels: List[dict] = field(default_factory=list)
    after: List[List[str]] = field(default_factory=list)  # quick commands on its results (verdicts), untimed
    pack: Optional[str] = None  # a folder under MODEL_DIR packed into $OUT/<folder>.tgz when the stage ends
    summarized: bool = False  # its commands' output goes to summary.txt too (a verdict of a line or two)


def _py(*args: str) -> List[str]:
    return [sys.executable, *args]


def _bench_model(*args: str) -> List[str]:
    return _py("-m", "simattn", "bench", "model", "--device", "cuda", "--models", DEIT, "--precision", "bf16",
               "--measure", "train-throughput", "--warmup", "3", "--repeats", "10", "--rounds", "1", *args)


def _sweep(out: str, batch: int, tokens: Sequence[int], kinds: Sequence[str], repeats: int, name: str,
           table: bool) -> List[str]:
    return _py("-m", "simattn", "bench", "attention", "--device", "cuda", "--heads", str(HEADS), "--head-dim",
               str(HEAD_DIM), "--batch", str(batch), "--tokens", *map(str, tokens), "--dtype", DTYPE, "--kinds",
               *kinds, "--repeats", str(repeats), "--rounds", "1", "--output", f"{out}/{name}",
               *(["--write-table", f"{out}/sima_gpu_table.json"] if table else []))


def _model_kernels(img_size, batch: int, head: Optional[str] = None) -> dict:
    """A model row's Triton launches, as a stage declares them: SimA on the kernels in a training step."""
    return {"model": DEIT, "head": head, "img_size": img_size, "batch": batch}


def stages(run: int, out: str) -> List[Stage]:
    """The stages of run 1 or 2, in order, writing to ``out``."""
    carried = Stage("carried kernels", 10, [_py("scripts/triton_compile_ahead.py", "--check", CACHE)],
                    summarized=True)
    if run == 1:
        names = ("attention_b128.json", "attention_b8.json", "attention_peers_b128.json")
        limits = (60, 40, 60)
        sweeps = [Stage(f"attention B={b}" + (" peers" if kinds == PEER_KINDS else ""), limit,
                        [_sweep(out, b, tokens, kinds, repeats, name, table=kinds == SWEEP_KINDS)],
                        kernels=[{"sweep": [b, list(tokens), list(kinds)]}])
                  for (b, tokens, kinds, repeats), name, limit in zip(SWEEPS, names, limits)]
        sweeps[-1].after = [_py("scripts/gpu_peers_check.py", f"{out}/attention_peers_b128.json")]
        # the tests check results, not speed: one launch configuration per kernel (SIMATTN_TRITON_AUTOTUNE=0), over
        # 8 processes (their small shapes compile there); -o addopts: the suite's own options need plugins the GPU
        # machine may lack. One inductor compile thread: its pool of compile processes outlives a test, which the
        # suite counts as a leak
        tests = ["env", "SIMATTN_TRITON_AUTOTUNE=0", "TORCHINDUCTOR_COMPILE_THREADS=1", *_py(
            "-m", "pytest", "-q", "-o", "addopts=-ra", "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "8",
            "--dist", "load", "tests/test_sima_cuda.py", "tests/test_sima_triton.py", "tests/test_activation_triton.py",
            "tests/test_agent_triton.py", "tests/test_linear_kinds_triton.py",
            "-k", "cuda or activation_triton or agent_triton or linear_kinds_triton")]
        # the compiled rows' graphs into inductor's on-disk caches (one short run of each, thrown away), so that run
        # 2's timed rows load them instead of compiling for a minute each, when run 2 lands on this machine
        warm = [_bench_model("--attn", "sima", "softmax", "--img-size", str(COMPILED[0]), "--batch-size",
                             str(COMPILED[1]), "--compile", "--compile-mode", mode, "--warmup", "1", "--repeats", "1",
                             "--timeout", "90", "--output", f"/tmp/simattn_warm_{mode}")
                for mode in ("default", "reduce-overhead")]
        side = Stage("tests, compile check, compiled rows warmed", 100,
                     [tests, _py("scripts/gpu_compile_check.py", f"{out}/compile_check.json"), *warm],
                     kernels=[_model_kernels(224, COMPILE_CHECK_BATCH)])
        return [carried, *sweeps, side]
    eager = Stage("model DeiT-S eager", 110, [_bench_model(
        "--attn", "sima", "triton=sima", "softmax", "--attn-kwargs", "triton.backend=triton", "--img-size",
        *(str(s) for s, _ in DEIT_SIZES), "--batch-size", *(str(b) for _, b in DEIT_SIZES), "--floor",
        "--timeout", "40", "--output", f"{MODEL_DIR}/model_eager")],
        kernels=[_model_kernels(s, b) for s, b in DEIT_SIZES], pack="model_eager")
    compiled = [Stage(f"model DeiT-S {mode}", limit, [_bench_model(
        "--attn", "sima", "softmax", "--img-size", str(COMPILED[0]), "--batch-size", str(COMPILED[1]), "--compile",
        "--compile-mode", mode, "--timeout", str(limit - 5), "--output", f"{MODEL_DIR}/{name}")],
        kernels=[_model_kernels(*COMPILED)], pack=name)
        for mode, limit, name in (("default", 55, "model_compiled"), ("reduce-overhead", 45, "model_graphs"))]
    # 150 classes at 1024x2048 and batch 8 are 2.5e9 logits: the loss runs in chunks
    fpn = Stage("model FPN 1024x2048", 50, [_bench_model(
        "--head", "fpn", "--img-size", FPN[0], "--batch-size", str(FPN[1]), "--attn", "sima", "--floor", "--warmup",
        "2", "--repeats", "5", "--timeout", "45", "--output", f"{MODEL_DIR}/model_fpn")],
        kernels=[_model_kernels(FPN[0], FPN[1], head="fpn")], pack="model_fpn",
        after=[_py("scripts/gpu_model_check.py", MODEL_DIR)])
    return [carried, eager, *compiled, fpn]


# ------------------------------------------------------------------------------------------------ running


def _run_stage(stage: Stage, out: Path, env: Dict[str, str]) -> None:
    """The stage's commands side by side, each in its own process group (killed whole at the limit), their output
    appended to logs.txt; one summary line; then its verdicts and its packed folder."""
    start = time.monotonic()
    logs = []
    procs = []
    for i, command in enumerate(stage.commands):
        log = tempfile.NamedTemporaryFile("w+", prefix=f"gpu_check_stage{i}_", suffix=".log", delete=False)
        logs.append(log)
        procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    codes = []
    for proc in procs:
        left = stage.limit - (time.monotonic() - start)
        try:
            codes.append(proc.wait(timeout=max(left, 0.1)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            codes.append(124)
    for proc in procs:  # what a command left running (compile workers) would take the next stage's cores
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.monotonic() - start
    outputs = []
    with open(out / "logs.txt", "a") as all_logs:
        for command, log in zip(stage.commands, logs):
            log.seek(0)
            outputs.append(log.read())
            all_logs.write(f"== {stage.name}: {shlex.join(command)}\n{outputs[-1]}")
            log.close()
            os.unlink(log.name)
    line = f"{stage.name}: exit {' '.join(map(str, codes))} in {seconds:.0f} s (limit {stage.limit} s)"
    print(line, flush=True)
    verdicts = outputs if stage.summarized else []
    verdicts += [subprocess.run(c, cwd=ROOT, env=env, capture_output=True, text=True).stdout for c in stage.after]
    with open(out / "summary.txt", "a") as summary:
        summary.write(line + "\n" + "".join(verdicts))
    print("".join(verdicts), end="", flush=True)
    if stage.pack and (Path(MODEL_DIR) / stage.pack).is_dir():
        with tarfile.open(out / f"{stage.pack}.tgz", "w:gz") as tar:
            tar.add(Path(MODEL_DIR) / stage.pack, arcname=stage.pack)


def _install_wheels(env: Dict[str, str], out: Path) -> None:
    """segmentation_models_pytorch (the FPN rows' decoder) from the carried wheels, where the image lacks it."""
    if subprocess.run(_py("-c", "import segmentation_models_pytorch"), env=env, capture_output=True).returncode == 0:
        return
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    done = wheels and subprocess.run(_py("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                         "--no-cache-dir", "--upgrade", "--target", "/tmp/simattn_wheels", *wheels),
                                     env=env).returncode == 0
    if done:
        env["PYTHONPATH"] += ":/tmp/simattn_wheels"
    else:
        with open(out / "summary.txt", "a") as summary:
            summary.write("segmentation_models_pytorch: not installed and no wheel in .whl (scripts/gpu_wheels.sh, "
                          "then carry .whl): the FPN rows will fail\n")


def run(run_number: int, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("summary.txt", "logs.txt"):
        (out / name).unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CACHE_DIR=str(ROOT / CACHE),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    head = subprocess.run(["bash", "-c", "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm "
                           "--format=csv; \"$0\" -c \"import torch, triton, timm; print('torch', torch.__version__, "
                           "'triton', triton.__version__, 'timm', timm.__version__, torch.cuda.get_device_name())\"; "
                           "nproc", sys.executable], env=env, capture_output=True, text=True)
    (out / "summary.txt").write_text(f"run {run_number}\n{head.stdout}{head.stderr}")
    print((out / "summary.txt").read_text(), end="", flush=True)
    if run_number == 2:
        subprocess.run(["rm", "-rf", MODEL_DIR])
        _install_wheels(env, out)
    for stage in stages(run_number, str(out)):
        _run_stage(stage, out, env)
    return 0


def _stand_in(command: List[str]) -> List[str]:
    """A command that prints what ``command`` would run, and exits 0 (the dry run)."""
    return _py("-c", "import sys; print(' '.join(sys.argv[1:]))", *command)


def dry_run(run_number: int, out: Path, kernels: bool) -> int:
    """Every stage of the run, in order, through the same stage runner with each command replaced by a stand-in
    that prints it: the limits, the summary and log lines a run writes; with ``kernels`` also the Triton launches
    each stage will ask for (listed on meta tensors, against the carried cache's manifest where there is one).
    Exit code 1 when the limits add up to more than :data:`RUN_LIMIT_S`."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("summary.txt", "logs.txt"):
        (out / name).unlink(missing_ok=True)
    carried = None
    if kernels:
        sys.path.insert(0, str(ROOT / "scripts"))
        import triton_compile_ahead as ahead

        carried = ahead.carried_requests(ROOT / CACHE)
    total = 0
    for stage in stages(run_number, str(out)):
        total += stage.limit
        stage.commands = [_stand_in(c) for c in stage.commands]
        stage.after = [_stand_in(c) for c in stage.after]
        _run_stage(stage, out, dict(os.environ))
        if kernels and stage.kernels:
            requests = set().union(*(ahead.check_requests(k) for k in stage.kernels))
            missing = "" if carried is None else f", {len(requests - carried)} of them not in {CACHE}"
            print(f"    Triton launches: {len(requests)} (kernel, signature, constexprs){missing}", flush=True)
    print(f"run {run_number}: stage limits add up to {total} s (at most {RUN_LIMIT_S})", flush=True)
    return 0 if total <= RUN_LIMIT_S else 1


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=int, choices=(1, 2), required=True)
    p.add_argument("--dry-run", action="store_true", help="walk the stages without a GPU: order, limits, logs")
    p.add_argument("--kernels", action="store_true", help="with --dry-run: list each stage's Triton launches")
    args = p.parse_args(argv)
    out = Path(os.environ.get("OUT") or "runs/gpu_check").resolve()
    if args.dry_run:
        return dry_run(args.run, out, args.kernels)
    return run(args.run, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
