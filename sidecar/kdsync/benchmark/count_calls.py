"""Runs ``kdsync`` with a deterministic profiler in every Python thread, for call counts.

``python -m kdsync.benchmark.count_calls STATS_FILE run --config member.yaml`` behaves like
``kdsync run`` and, when the sidecar exits (SIGTERM), writes pstats to ``STATS_FILE``.
``python -m cProfile`` would see only the main thread; the sidecar also works in its source
reader thread and in ``asyncio.to_thread`` workers, so each new thread gets a profiler of
its own (``threading.setprofile`` installs one on the thread's first event) and the
profiles are merged at exit. Slow (every call is counted): use it for *how many calls per
event*, and py-spy for where the time goes.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from kdsync.cli import main as kdsync_main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m kdsync.benchmark.count_calls STATS_FILE kdsync-args...")
        return 2
    stats_file, kdsync_args = args[0], args[1:]
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def profile_this_thread(_frame: FrameType, _event: str, _arg: Any) -> None:
        profile = cProfile.Profile()
        with lock:
            profiles.append(profile)
        profile.enable()  # replaces this hook for the rest of the thread's life

    threading.setprofile(profile_this_thread)
    main_profile = cProfile.Profile()
    profiles.append(main_profile)
    main_profile.enable()
    try:
        return kdsync_main(kdsync_args)
    finally:
        main_profile.disable()
        threading.setprofile(None)
        with lock:
            stats = pstats.Stats(profiles[0])
            for profile in profiles[1:]:
                stats.add(profile)
        stats.dump_stats(stats_file)


if __name__ == "__main__":
    sys.exit(main())
