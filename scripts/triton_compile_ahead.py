"""Compile, on a machine without a GPU, every Triton kernel the GPU check (``scripts/gpu_check.py``) will launch,
for an H100/H200 (sm_90) and the GPU machine's Triton, into a Triton cache directory carried with the device run.

What it compiles: each stage's Triton launches as ``gpu_check.py`` declares them (``Stage.kernels``): the sweeps'
kinds on their kernels at every batch and token count, forward and forward+backward, and the model rows' SimA
attention in a training step at each size and batch (the attention module of the model the row builds, on the
input shape the model gives it). Every autotuned configuration is compiled (the device autotunes over them), with
``simattn.kernels.host.hopper_stand_in`` (CPU tensors take the compiled path of an H100/H200; Triton's launcher
stubbed, nothing runs). The CUDA tests' own small shapes are not in it: they run in one configuration and compile
on the device, in 8 processes.

Triton's on-disk cache key (``triton.runtime.cache.get_cache_key`` and ``triton.compiler.compile``, read in
Triton 3.6.0) is the sha256 of: ``triton_key()`` (the version, and the sha256 of every file of the installed triton
package's compiler, backends and language, and of ``_C/libtriton.so``: so the same wheel, Python 3.12's, as on the
device), the source's hash (the kernel's source and the sources of the functions it calls, the global constexprs
it reads, its first line number in the file, the argument types, the specialization of each argument: 16-byte
divisibility of pointers and integers, and the constexprs), the backend's (the ``ptxas --version`` output of
Triton's bundled ptxas, or of ``TRITON_PTXAS_PATH``'s, and the arch, 90), the compile options (warps, stages,
``enable_fp_fusion`` from ``TRITON_DEFAULT_FP_FUSION``, ``debug`` from ``TRITON_DEBUG``, the libdevice file's
hash, ...) and the cache-invalidating environment variables that are set. No CUDA driver, GPU or path enters it.
So an entry written here is a hit on the device when: its Triton is the same wheel (3.6.0, cp312, x86-64: this
script compiles with that wheel in a venv of Python 3.12 when the Triton here is another), this checkout's kernel
sources travel unchanged, no ``TRITON_PTXAS_PATH``, ``TRITON_DEBUG``, ``TRITON_DEFAULT_FP_FUSION`` or other
cache-invalidating variable is set there, and the arguments specialize alike (the check's tensors are views of
fresh allocations, 16-byte aligned on both). The manifest written beside the entries records the key's
machine-dependent parts (triton_key's hash, ptxas's version, the variables set); ``--check`` compares them with the
device's, and points the entries' group files (absolute paths in Triton's layout) at the folder's place there.

At a kernel signature's first launch Triton also builds a C launcher module (and once its CUDA utilities module)
with the machine's C compiler into the same cache, keyed by the sha256 of the C source (made from the signature)
and the platform (x86-64 Linux): they are built here too, linked against a stand-in libcuda.so.1 (the device's real
one is loaded there; this machine's glibc, 2.36, is older than the device image's). One that fails to load there
is rebuilt by Triton, with a warning.

Only what a cache hit loads is kept (the cubin, the metadata JSON, the group file, the launcher modules; not the
IR texts), so the folder stays well under a device call's 64 MiB. A build reuses the folder's entries and what a
build cut short left (``--fresh``: none).

It needs about 13 GB of memory (the PolaFormer sweep's torch-side features at B 128, N 4097) and, on 2 busy cores,
about 40 minutes the first time (ptxas takes minutes on some of FLatten's and InLine's configurations) and under
3 minutes again (hits). It wrote 143 kernels and 15 launcher modules (38 MiB) for the 144 launches of the check.

Usage, from the repo root (writes .triton_sm90/, ignored by git, carried with the device runs):
    .venv/bin/python scripts/triton_compile_ahead.py [--cache .triton_sm90] [--jobs 2] [--fresh]
    python3 scripts/triton_compile_ahead.py --check .triton_sm90     (on the device: relocate and compare keys)
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
#: the GPU machine's Triton and Python (its image: torch 2.11.0, Triton 3.6.0, timm; Python 3.12)
DEVICE_TRITON, DEVICE_PYTHON = "3.6.0", "3.12"
#: the venv this script compiles in when the Triton here is another (made once, reused)
VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "simattn" / "sm90-triton-3.6"
VENV_PACKAGES = ["torch==2.11.0", f"triton=={DEVICE_TRITON}", "torchvision==0.26.0", "timm==1.0.31", "pillow",
                 "pyyaml", "tqdm", "safetensors", "segmentation_models_pytorch==0.6.0"]
#: what a cache hit reads: the binary, the metadata, the group file (__grp__*.json); Triton's launcher modules
KEEP = (".cubin", ".json", ".so")
MANIFEST = "manifest.json"


# ------------------------------------------------------------------------------------------------ requests


_paused: List[bool] = []  # not empty: launches go unrecorded


def _recording(found: Set[str]):
    """Patches that record each launch a plan makes: (the plan's call and tensors' signature, the kernel, its
    constexprs), device and mode left out. Returns a function that undoes them."""
    from simattn.kernels import host

    planned, init = host.planned, host.Launch.__init__
    current = []

    def record_planned(key, build):
        if _paused:
            return planned(key, build)
        current.append(repr((key[0], key[1], key[4])))
        try:
            return planned(key, build)
        finally:
            current.pop()

    def record_launch(self, kernel, grid, consts, mode):
        if _paused:
            return init(self, kernel, grid, consts, mode)
        fn = kernel
        while hasattr(fn, "fn"):
            fn = fn.fn
        found.add(repr((current[-1] if current else None, getattr(fn, "__name__", repr(fn)), sorted(consts.items()))))
        init(self, kernel, grid, consts, mode)

    host.planned, host.Launch.__init__ = record_planned, record_launch

    def undo():
        host.planned, host.Launch.__init__ = planned, init
    return undo


@contextlib.contextmanager
def _on_meta() -> Iterator[None]:
    """Meta tensors by default, the kernels' dry run (planned, not launched), and autocast off on meta (asking
    about meta raises; the check's bf16 tensors see it off too)."""
    import torch

    from simattn.kernels import host

    enabled = torch.is_autocast_enabled
    torch.is_autocast_enabled = lambda *device: False if device == ("meta",) else enabled(*device)
    try:
        with host.dry_run(), torch.device("meta"):
            yield
    finally:
        torch.is_autocast_enabled = enabled


def _listed(calls: Callable[[str], None]) -> Set[str]:
    """The launches ``calls("meta")`` asks for, on meta tensors (nothing compiled, nothing allocated)."""
    from simattn.kernels import host

    found: Set[str] = set()
    undo = _recording(found)
    try:
        host.PLANS.clear()
        with _on_meta():
            calls("meta")
    finally:
        host.PLANS.clear()
        undo()
    return found


def _fused_qkv(b: int, n: int, device: str):
    """q, k, v (B, H, N, d) bf16: views of one fused projection, as the sweeps make them, as leaves."""
    import torch

    from gpu_check import HEAD_DIM, HEADS

    fused = torch.empty(b, n, 3, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    return [t.detach().requires_grad_() for t in fused.permute(2, 0, 3, 1, 4).unbind(0)]


def _sweep_calls(b: int, tokens: List[int], kinds: List[str]) -> Callable[[str], None]:
    """A sweep's calls to the kinds on Triton kernels (the '_triton' ones), forward and forward+backward."""
    def calls(device: str) -> None:
        import torch

        from gpu_check import HEAD_DIM, HEADS
        from simattn.bench.attention.kinds import kind_fn

        for n in tokens:
            qkv = _fused_qkv(b, n, device)
            for fn in [kind_fn(k, *qkv, HEADS, HEAD_DIM, sweep="cuda") for k in kinds if k.endswith("_triton")]:
                with torch.no_grad():
                    fn(*qkv)
                out = fn(*qkv)
                torch.autograd.grad(out, qkv, torch.empty_like(out))
    return calls


def _model(row: dict):
    """The row's model as ``bench model`` builds it (SimA on the kernels), on the current default device, bf16."""
    import torch

    from simattn.bench.model.runner import build_model
    from simattn.bench.model.spec import BenchSpec

    size = row["img_size"]
    spec = BenchSpec(model=row["model"], head=row["head"], attn="sima", attn_kwargs={"backend": "triton"},
                     img_size=[int(s) for s in size.split("x")] if isinstance(size, str) else size,
                     batch_size=row["batch"], precision="bf16")
    return spec, build_model(spec).to(torch.bfloat16)


def _model_inputs(row: dict):
    """The row's attention modules and the input shape the model gives each (one forward on meta tensors, its own
    launches not recorded): one (module, shape) per distinct pair."""
    import torch

    from simattn.attention import SimAAttention
    from simattn.bench.model.runner import size_hw

    spec, model = _model(row)
    seen = {}

    def hook(module, args):
        seen.setdefault((repr(module), tuple(args[0].shape)), (module, tuple(args[0].shape)))

    hooks = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, SimAAttention)]
    _paused.append(True)
    try:
        with torch.no_grad():
            model(torch.empty(row["batch"], 3, *size_hw(spec.img_size), dtype=torch.bfloat16, device="meta"))
    finally:
        _paused.pop()
        for h in hooks:
            h.remove()
    return list(seen.values())


def _model_calls(row: dict) -> Callable[[str], None]:
    """A model row's SimA calls: its attention module alone on the input the model gives it, forward and backward
    (the model around it costs a CPU minutes, and launches nothing of Triton's)."""
    def calls(device: str) -> None:
        import copy

        import torch

        with _on_meta():
            modules = _model_inputs(row)
        for module, shape in modules:
            module = copy.deepcopy(module).to_empty(device=device)
            x = torch.empty(shape, dtype=torch.bfloat16, device=device, requires_grad=True)
            out = module(x)
            out.backward(torch.empty_like(out))
    return calls


def compile_calls(kernels: dict) -> Callable[[str], None]:
    """What this script runs for one of a stage's kernel declarations (``gpu_check.Stage.kernels``)."""
    if "sweep" in kernels:
        return _sweep_calls(*kernels["sweep"])
    return _model_calls(kernels)


def check_requests(kernels: dict) -> Set[str]:
    """The launches the check itself asks for at one declaration, listed on meta tensors: the sweep's own calls
    (``bench attention``'s ``run_gpu`` with its kinds, on fused views) or the row's whole model in a training step."""
    import torch

    if "sweep" in kernels:
        from simattn.bench import attention

        b, tokens, kinds = kernels["sweep"]
        fake = {"median_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0, "min_ms": 1.0, "runs": 1}
        made = attention.make_qkv

        def on_meta(b, heads, n, d, layout, gen, device, dtype):  # no data: the fused layout on meta
            return list(torch.empty(b, n, 3, heads, d, dtype=dtype).permute(2, 0, 3, 1, 4).unbind(0))

        def calls(device):
            from gpu_check import HEAD_DIM, HEADS

            attention.make_qkv = on_meta
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # (its progress lines)
                    attention.run_gpu(list(tokens), list(kinds), b, HEADS, HEAD_DIM, torch.bfloat16, device, 1.0,
                                      timer=lambda call: (call(), fake)[1])
            finally:
                attention.make_qkv = made
        return _listed(calls)

    def model_calls(device):
        from simattn.bench.model.runner import size_hw

        spec, model = _model(kernels)
        out = model(torch.empty(kernels["batch"], 3, *size_hw(spec.img_size), dtype=torch.bfloat16))
        out.backward(torch.empty_like(out))
    return _listed(model_calls)


def script_requests(kernels: dict) -> Set[str]:
    """The launches this script compiles for one declaration, listed as :func:`check_requests` lists the check's."""
    return _listed(compile_calls(kernels))


def declarations() -> List[dict]:
    """Every kernel declaration of both runs' stages, once each."""
    import gpu_check

    found = []
    for run in (1, 2):
        for stage in gpu_check.stages(run, "OUT"):
            found += [k for k in stage.kernels if k not in found]
    return found


# ------------------------------------------------------------------------------------------------ compiling


def _compile_only(compiled: list) -> None:
    """Autotuned kernels compile every configuration and launch none; ``compiled`` collects the compiled
    kernels."""
    from triton.runtime.autotuner import Autotuner

    def run(self, *args, **kwargs):
        kwargs.pop("grid", None)
        kwargs.pop("warmup", None)
        for config in self.configs:
            kernel = self.fn.run(*args, grid=None, warmup=True, **kwargs, **config.all_kwargs())
            compiled.append(kernel)
        self.best_config = self.configs[0]  # what the launch plan reads after a tuned launch

    Autotuner.run = run


def _launchers(compiled: list) -> int:
    """Triton's C launcher of each compiled kernel's signature, and its CUDA utilities module, built into the cache
    as the device would build them at a kernel's first launch (a C compile each; their cache key is the C source and
    the platform, x86-64 Linux), linked against the stand-in libcuda.so.1 at ``TRITON_LIBCUDA_PATH`` (the device's
    real one is loaded there), not loaded here; the number of signatures."""
    from triton.backends.nvidia.driver import CudaLauncher, CudaUtils
    from triton.runtime import build

    class Unloaded:  # what a module built here stands for (loading it needs a GPU's libcuda)
        def __getattr__(self, name):
            return None

    signatures = {}
    for k in compiled:
        key = (k.src.fn.__name__, repr(sorted(k.src.signature.items())), repr(sorted(k.src.constants.items())))
        signatures.setdefault(key, k)
    load, build._load_module_from_path = build._load_module_from_path, lambda name, path: Unloaded()
    try:
        CudaUtils()
        for k in signatures.values():
            CudaLauncher(k.src, k.metadata)
    finally:
        build._load_module_from_path = load
    return len(signatures)


def _libcuda_stand_in(folder: Path) -> None:
    """An empty libcuda.so.1 in ``folder`` for Triton's C modules to link against (``TRITON_LIBCUDA_PATH``)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(folder / "libcuda.so.1"), "-x",
                    "c", "/dev/null"], check=True)
    (folder / "libcuda.so").symlink_to("libcuda.so.1")
    os.environ["TRITON_LIBCUDA_PATH"] = str(folder)  # the spawned processes inherit it


def _job(kernels: dict):
    """One declaration's calls compiled for sm_90 on CPU tensors: the configurations and launchers compiled, the
    seconds, the launches listed, the error."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from simattn.kernels import host

    compiled: list = []
    _compile_only(compiled)
    start = time.perf_counter()
    found: Set[str] = set()
    undo = _recording(found)
    error, launchers = None, 0
    try:
        with host.hopper_stand_in(tune=True):
            compile_calls(kernels)("cpu")
        launchers = _launchers(compiled)
    except Exception as e:  # noqa: BLE001 - reported with its declaration; the others still compile
        error = f"{type(e).__name__}: {e}"
    finally:
        undo()
    return {"configs": len(compiled), "launchers": launchers, "seconds": time.perf_counter() - start,
            "requests": sorted(found), "error": error}


def _run_jobs(todo: List[dict], jobs: int) -> Iterator[Tuple[dict, dict]]:
    """Each declaration's job in a process of its own, ``jobs`` at a time (one killed, by the kernel for memory,
    say, is reported and the others go on); (declaration, its result) as each ends."""
    waiting, running = list(todo), []
    while waiting or running:
        while waiting and len(running) < jobs:
            kernels = waiting.pop(0)
            running.append((kernels, subprocess.Popen([sys.executable, __file__, "--job", json.dumps(kernels)],
                                                      stdout=subprocess.PIPE, text=True)))
        time.sleep(0.5)
        for kernels, proc in [r for r in running if r[1].poll() is not None]:
            running.remove((kernels, proc))
            lines = proc.stdout.read().splitlines()
            yield kernels, (json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "configs": 0, "launchers": 0, "seconds": 0, "requests": [],
                "error": f"its process ended with code {proc.returncode} (killed for memory?)"})


def fingerprint() -> dict:
    """The machine-dependent parts of Triton's cache key here (see the module docstring)."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.nvidia.compiler import get_ptxas_version
    from triton.runtime.cache import triton_key

    return {"triton": triton.__version__, "python": sys.version.split()[0],
            "triton_key_sha256": hashlib.sha256(triton_key().encode()).hexdigest(),
            "ptxas": get_ptxas_version(90).strip().splitlines()[-1],
            "env": sorted(get_cache_invalidating_env_vars().items())}


def _prune(cache: Path) -> None:
    """Keep what a cache hit loads; group files name their children relative to the cache folder (``--check``
    points them at its place on the device)."""
    for entry in cache.iterdir():
        if not entry.is_dir():
            continue
        for f in entry.iterdir():
            if f.is_dir() or not f.name.endswith(KEEP):
                shutil.rmtree(f) if f.is_dir() else f.unlink()
        for group in entry.glob("__grp__*.json"):
            children = json.loads(group.read_text())["child_paths"]
            kept = {c: f"{entry.name}/{Path(p).name}" for c, p in children.items() if c.endswith(KEEP)}
            group.write_text(json.dumps({"child_paths": kept}))


def relocate(cache: Path) -> int:
    """Point every group file's children at ``cache``'s place here (absolute paths, as Triton reads them); the
    number of entries."""
    entries = 0
    for group in cache.glob("*/__grp__*.json"):
        children = json.loads(group.read_text())["child_paths"]
        moved = {c: str(group.parent.resolve() / Path(p).name) for c, p in children.items()}
        group.write_text(json.dumps({"child_paths": moved}))
        entries += 1
    return entries


def check(cache: Path) -> int:
    """On the device: relocate the carried cache and compare its key's machine-dependent parts with Triton here."""
    manifest_path = cache / MANIFEST
    if not manifest_path.exists():
        print(f"{cache}: no carried kernels ({MANIFEST} missing): Triton compiles every kernel at first use")
        return 1
    manifest = json.loads(manifest_path.read_text())
    entries = relocate(cache)
    here, there = fingerprint(), manifest["fingerprint"]
    differ = [k for k in ("triton_key_sha256", "ptxas", "env") if here[k] != there[k]]
    print(f"{cache}: {entries} carried kernels for {len(manifest['requests'])} launches; cache key "
          + (f"differs here in {', '.join(differ)} ({there} compiled, {here} here): they will miss"
             if differ else "parts match this machine's Triton: they are hits"))
    return 1 if differ else 0


def carried_requests(cache: Path) -> Optional[Set[str]]:
    """The launches a carried cache was compiled for (its manifest), None without one."""
    path = Path(cache) / MANIFEST
    return set(json.loads(path.read_text())["requests"]) if path.exists() else None


def _device_python() -> Path:
    """The venv with the device's Triton (made here once, with pip from the package index; a make cut short is
    finished the next time)."""
    python, done = VENV / "bin" / "python", VENV / "made"
    if not done.exists():
        candidates = [shutil.which(f"python{DEVICE_PYTHON}"), *sorted(
            (Path.home() / ".pyenv" / "versions").glob(f"{DEVICE_PYTHON}.*/bin/python{DEVICE_PYTHON}"), reverse=True)]
        base = next((c for c in candidates if c and subprocess.run([str(c), "-c", ""], capture_output=True,
                                                                      check=False).returncode == 0), None)
        if base is None:
            raise SystemExit(f"triton_compile_ahead: needs Python {DEVICE_PYTHON} (the device's, for its Triton "
                             f"wheel) on PATH or in ~/.pyenv; install it, then run this again")
        print(f"making {VENV} (Python {DEVICE_PYTHON}, Triton {DEVICE_TRITON}, torch 2.11.0)", flush=True)
        subprocess.run([str(base), "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *VENV_PACKAGES], check=True)
        done.touch()
    return python


def _jobs(kernels: List[dict]) -> List[dict]:
    """The declarations as jobs: one per kind on Triton kernels of each sweep, so the processes share the work."""
    jobs = []
    for k in kernels:
        if "sweep" in k:
            b, tokens, kinds = k["sweep"]
            jobs += [{"sweep": [b, tokens, [kind]]} for kind in kinds if kind.endswith("_triton")]
        else:
            jobs.append(k)
    return jobs


def build(cache: Path, jobs: int, fresh: bool) -> int:
    """Compile every declaration's calls in ``jobs`` processes into ``cache``: in a work folder beside it (what a
    build cut short left there, and the entries of ``cache``, are hits; ``fresh``: start from nothing), then
    pruned, with the manifest, put in place."""
    import triton

    from simattn.kernels import host

    if host.INTERPRETER:
        raise SystemExit("triton_compile_ahead: TRITON_INTERPRET=1 compiles nothing; unset it")
    work = cache.with_name(cache.name + ".tmp")
    if fresh:
        shutil.rmtree(work, ignore_errors=True)
    elif cache.is_dir():
        shutil.copytree(cache, work, dirs_exist_ok=True)
        relocate(work)
    os.environ["TRITON_CACHE_DIR"] = str(work)  # the spawned processes inherit it
    stand_in = Path(tempfile.mkdtemp(prefix="libcuda_stand_in_"))
    _libcuda_stand_in(stand_in)
    print(f"compiling for sm_90 with Triton {triton.__version__} (Python {sys.version.split()[0]}) into {cache}",
          flush=True)
    start, requests, failed = time.perf_counter(), set(), False
    todo = _jobs(declarations())
    try:
        for kernels, done in _run_jobs(todo, jobs):
            requests.update(done["requests"])
            print(f"  {kernels}: {len(done['requests'])} launches, {done['configs']} configurations and "
                  f"{done['launchers']} launchers compiled in {done['seconds']:.0f} s"
                  + (f"; failed: {done['error']}" if done["error"] else ""), flush=True)
            failed = failed or done["error"] is not None
    finally:
        shutil.rmtree(stand_in)
    _prune(work)
    entries = sum(1 for _ in work.glob("*/__grp__*.json"))
    launchers = sum(1 for _ in work.glob("*/*.so"))
    manifest = {"fingerprint": fingerprint(), "declarations": todo, "requests": sorted(requests)}
    (work / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(cache, ignore_errors=True)
    work.rename(cache)
    size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    print(f"{entries} kernels and {launchers} launcher modules ({size / 2**20:.1f} MiB) for {len(requests)} launches "
          f"in {time.perf_counter() - start:.0f} s", flush=True)
    return 1 if failed else 0


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=".triton_sm90", help="the Triton cache folder to write")
    p.add_argument("--jobs", type=int, default=2, help="processes compiling at once")
    p.add_argument("--fresh", action="store_true", help="compile everything again (default: the cache's entries and "
                   "what a build cut short left are reused)")
    p.add_argument("--job", help=argparse.SUPPRESS)  # one declaration (JSON), compiled in this process
    p.add_argument("--check", metavar="CACHE", help="on the device: relocate a carried cache, compare its key")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "scripts"))
    if args.check:
        return check(Path(args.check))
    if args.job:
        with contextlib.redirect_stdout(sys.stderr):  # stdout: the result alone
            done = _job(json.loads(args.job))
        print(json.dumps(done))
        return 0
    import triton

    if triton.__version__ != DEVICE_TRITON or not sys.version.startswith(DEVICE_PYTHON + "."):
        python = _device_python()
        print(f"Triton here is {triton.__version__} (Python {sys.version.split()[0]}), the device's "
              f"{DEVICE_TRITON} (Python {DEVICE_PYTHON}): compiling in {VENV}", flush=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
        return subprocess.run([str(python), __file__, *argv], env=env).returncode
    return build((ROOT / args.cache) if not Path(args.cache).is_absolute() else Path(args.cache), args.jobs,
                 args.fresh)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
