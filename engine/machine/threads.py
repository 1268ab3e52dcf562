"""Joining threads that ran MLX code, all the way down to the OS thread.

`threading.Thread.join` returns when the thread's Python function is done, before the
OS thread has run its C++ thread-local destructors (MLX keeps per-thread stream
state). A process that exits in that window races them, and libstdc++ aborts it with
"terminate called without an active exception" (seen in ~1 of 4 runs of a script
that closes an Engine and exits). So after the join we wait, briefly, for the OS
thread itself to be gone (Linux: /proc/self/task/<tid>; elsewhere a short grace).
"""

from __future__ import annotations

import os
import threading
import time


def join_fully(thread: threading.Thread, timeout: float, grace: float = 2.0) -> bool:
    """Join `thread`, then wait up to `grace` seconds for its OS thread to exit.
    Returns False if the Python-level join timed out."""
    tid = thread.native_id
    thread.join(timeout=timeout)
    if thread.is_alive():
        return False
    task = f"/proc/self/task/{tid}"
    if tid is None or not os.path.isdir("/proc/self/task"):
        time.sleep(min(grace, 0.05))
        return True
    deadline = time.monotonic() + grace
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.002)
    return True
