"""What the probe commands share: run the async job, turn Ctrl-C and clear input errors into exit codes."""
from __future__ import annotations

import asyncio
import sys

from agent.backends.base import BackendError
from agent.rundir import RunError

__all__ = ["run_async"]


def run_async(coro, kept: str):
    """``(result, 0)``; ``(None, 130)`` on Ctrl-C (saying what is kept); ``(None, 2)`` on a clear error."""
    try:
        return asyncio.run(coro), 0
    except KeyboardInterrupt:
        print(f"interrupted; rerun to resume ({kept} are kept)", file=sys.stderr)
        return None, 130
    except (RunError, BackendError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return None, 2
