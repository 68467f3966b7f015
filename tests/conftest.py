"""Isolation for every test: the same process-wide torch settings at each test's start, no process outliving the
test that started it, and no temp folder outliving the session."""
import atexit
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import torch

# Tests measure behaviour, not speed: keep them deterministic and light on a shared 2-core machine. Under
# pytest-xdist the cores are split between the workers (3 workers on 2 cores: one thread each), and the processes a
# test starts inherit that count through OMP_NUM_THREADS unless the test sets its own.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
SUITE_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(SUITE_THREADS)
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(SUITE_THREADS))
# Triton fixes whether kernels run compiled or in its interpreter when it decorates them, at the first import of
# simattn.kernels.host (the kernels import it): without CUDA, the interpreter (CPU tensors), set before any test imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: every process the suite starts inherits this variable, so it can be found even after its parent died
MARK = "SIMATTN_TEST_SESSION"
_session = f"{os.getpid()}-{uuid.uuid4().hex}"
os.environ[MARK] = _session

# Everything the suite and its child processes put in the temp folder (torchrun's torchelastic_* folders, pytest's
# tmp_path, tempfile users) goes under one folder that is removed when the session ends.
_temp_root = Path(tempfile.mkdtemp(prefix="simattn-tests-"))
os.environ["TMPDIR"] = str(_temp_root)
tempfile.tempdir = None  # re-read TMPDIR


def _remove_temp_root():
    shutil.rmtree(_temp_root, ignore_errors=True)


def pytest_unconfigure(config):
    _remove_temp_root()


# and once more at exit: exit handlers registered later (torch's compile caches) run before this one
atexit.register(_remove_temp_root)


#: seconds each test module took on the 2-core machine the suite is sized for (``--write-module-seconds`` rewrites
#: it); only the order of the modules under pytest-xdist depends on it
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


#: the modules that load the edge runtimes (ExecuTorch, Core ML): under pytest-xdist they run as one unit, so that
#: one worker pays for those imports and the first lowering
EDGE_RUNTIME_MODULES = {f"tests/test_{name}.py" for name in ("deploy_inputs", "deploy_registry", "export_delegation",
                                                            "export_edge", "segment_deploy")}


def needs(*packages: str):
    """The skip mark of a module whose tests need ``packages``: they are looked up, not imported, so that collecting
    the suite does not load the edge runtimes (seconds each) on every worker."""
    from importlib.util import find_spec
    missing = [name for name in packages if find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")


def pytest_addoption(parser):
    parser.addoption("--write-module-seconds", metavar="PATH", default=None,
                     help="write each test module's total time (setup, call, teardown) to PATH as JSON")


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


#: modules whose test functions are units of their own: each function is long alone (a capture of every registered
#: network), and they share nothing but builds of small models, so one module need not hold one worker throughout
SPLIT_BY_FUNCTION = {"tests/test_graph_capture.py"}


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to under pytest-xdist: its module, the edge-runtime modules together, or one
    test function of a module of :data:`SPLIT_BY_FUNCTION`."""
    module = _module(nodeid)
    if module in EDGE_RUNTIME_MODULES:
        return "edge runtimes"
    if module in SPLIT_BY_FUNCTION and "::" in nodeid:
        return nodeid.split("[")[0]
    return module


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config):
    """``-n logical`` (or ``auto``): one worker more than the cores this process may use. The DDP, kill-and-resume
    and subprocess tests leave their worker waiting on child processes or a timeout, and the extra worker keeps the
    cores busy meanwhile (on 2 cores: 356 s for the suite with 3 workers, 390 s with 2, 422 s with 4)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with :func:`_unit` as the scope: each unit runs on one worker, so a module-scoped fixture
    (a trained model, an exported file) is built once."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist the units of work (:func:`_unit`) are handed out longest first, by their modules' recorded
    seconds (a module not recorded yet counts as long when it holds a test marked slow), so that the short ones even
    out the workers' ends; pytest-randomly has shuffled the items already and the sort is stable, so the order within
    a unit still follows its seed."""
    if _WORKERS <= 1:
        return
    import json
    recorded = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.is_file() else {}
    slow = {_module(item.nodeid) for item in items if item.get_closest_marker("slow")}
    longest = max(recorded.values(), default=0.0)
    units_of: dict = {}  # module → its units (several for a module split by function)
    for item in items:
        units_of.setdefault(_module(item.nodeid), set()).add(_unit(item.nodeid))
    unit_seconds: dict = {}
    for module, units in units_of.items():
        seconds = recorded.get(module, longest if module in slow else 0.0)
        for unit in units:  # a split module's seconds shared evenly: its functions are of a size
            unit_seconds[unit] = unit_seconds.get(unit, 0.0) + seconds / len(units)
    items.sort(key=lambda item: (-unit_seconds[_unit(item.nodeid)], _unit(item.nodeid)))


_module_seconds: dict = {}


def pytest_runtest_logreport(report):
    _module_seconds[_module(report.nodeid)] = _module_seconds.get(_module(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--write-module-seconds")
    # under pytest-xdist the controller receives every worker's reports: it alone writes
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        import json
        from simattn.utils.io import atomic_write_json
        atomic_write_json({k: round(v, 1) for k, v in sorted(_module_seconds.items())}, Path(path))


def marked_processes(variable: str, value: str) -> list:
    """PIDs of live processes (not zombies) other than this one whose environment holds ``variable=value``: every
    process started under that setting, found even after its parent died."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"{variable}={value}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _started_by_suite():
    """PIDs of the live processes this session started, other than this one."""
    return marked_processes(MARK, _session)


def _end_leftovers(grace: float) -> list:
    """Wait up to ``grace`` seconds for the suite's other processes to end, then SIGKILL those left (a stopped
    process too); returns what had to be killed, with its command line."""
    deadline = time.monotonic() + grace
    left = _started_by_suite()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _started_by_suite()
    killed = []
    for pid in left:
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            os.kill(pid, signal.SIGKILL)
            killed.append(f"{pid}: {cmd}")
        except (OSError, ProcessLookupError):
            pass
    return killed


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_as_in_a_terminal():
    """Ctrl-C raises KeyboardInterrupt in the tests, as in a terminal, even when the suite was started in the
    background of a non-interactive shell (which starts it with SIGINT ignored)."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(autouse=True, scope="session")
def _no_process_outlives_the_suite():
    yield
    killed = _end_leftovers(grace=10)
    assert not killed, f"processes started by the suite were still alive at its end (killed now): {killed}"


@pytest.fixture(autouse=True)
def _isolated(request):
    """Each test starts from the suite's settings and seed, and ends with no process of its own still running."""
    from simattn.utils.global_state import GlobalState

    if torch.get_num_threads() != SUITE_THREADS:
        torch.set_num_threads(SUITE_THREADS)
    torch.manual_seed(0)
    state = GlobalState()
    yield
    state.restore()
    killed = _end_leftovers(grace=10)
    assert not killed, f"{request.node.nodeid} left processes running (killed now): {killed}"


@pytest.fixture
def one_thread():
    # Tiny models on a busy CPU run fastest single-threaded; the autouse fixture restores the suite's setting.
    torch.set_num_threads(1)
    yield 1


@pytest.fixture
def kernel_device():
    """Where the Triton kernels of simattn.kernels run in this process: "cpu" in the interpreter, "cuda" where
    they were compiled (skipped without a CUDA device)."""
    from simattn.kernels import host
    if host.INTERPRETER:
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("the kernels are compiled but there is no CUDA device")
    return "cuda"
