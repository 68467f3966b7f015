"""Killing a run at a chosen moment of its log, as a crash would (the resume tests)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
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
