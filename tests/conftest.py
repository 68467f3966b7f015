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
# pytest-xdist the cores are split between the workers (2 workers on 2 cores: one thread each), and the processes a
# test starts inherit that count through OMP_NUM_THREADS unless the test sets its own.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
SUITE_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(SUITE_THREADS)
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(SUITE_THREADS))

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


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``--dist loadscope``) each module runs on one worker, so a module-scoped fixture (a
    trained model, an exported file) is built once. The modules that hold a long test (marked slow) are handed out
    first, so that none is left running alone at the end; pytest-randomly has shuffled the items already and the
    sort is stable, so the order still follows its seed."""
    if _WORKERS > 1:
        slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


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
