"""Killing a run at a chosen moment of its log, as a crash would (the resume tests)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable, List, Tuple


def kill_on_line(victim: subprocess.Popen, when: Callable[[str], bool]) -> Tuple[threading.Thread, List[str]]:
    """Start a thread that reads ``victim``'s stdout (text, line-buffered) and SIGKILLs it at the first line for
    which ``when`` holds; returns the thread and the lines seen (for the failure message)."""
    seen: List[str] = []

    def watch() -> None:
        for line in victim.stdout:
            seen.append(line)
            if when(line):
                os.kill(victim.pid, signal.SIGKILL)
                return

    thread = threading.Thread(target=watch)
    thread.start()
    return thread, seen


def sigterm_when(victim: subprocess.Popen, ready: Callable[[], bool], timeout: float = 120) -> str:
    """Wait (up to ``timeout`` s) until ``ready()`` holds while ``victim`` runs, SIGTERM it and return its stderr
    (text); a victim alive afterwards is killed. Fails where it ended first or ``ready`` never held."""
    try:
        deadline = time.monotonic() + timeout
        while not ready() and victim.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert victim.poll() is None, "it ended before it could be stopped"
        assert ready(), f"not ready to be stopped within {timeout} s"
        victim.send_signal(signal.SIGTERM)
        return victim.communicate(timeout=120)[1]
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
