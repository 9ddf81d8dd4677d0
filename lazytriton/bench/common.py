"""Small helpers the harness's modules share."""
from __future__ import annotations

import sys
import time
import traceback
from typing import Callable

Progress = Callable[[str], None]


def progress(msg: str) -> None:
    """A progress line on stderr: what runs now."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def row(system: str, kind: str, samples, **extra) -> dict:
    """One row of a section: kind is "lazytriton", "other" (what a user would
    otherwise run) or "floor"."""
    return {"system": system, "kind": kind, "samples": [float(s) for s in samples], **extra}


def why(exc: BaseException, limit: int = 200) -> str:
    """An exception in one line, for a note."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:limit]}"


def guarded(name: str, title: str, measure: Callable[[], dict]) -> dict:
    """measure()'s section, or, when it raises, a section with no rows whose
    note says why (the traceback goes to stderr, which the runner shows): one
    section failing does not lose the others its process measures."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        return {"title": title, "rows": [], "notes": [f"{name}: not measured in this process ({why(exc, 400)})"]}
