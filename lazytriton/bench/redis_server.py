"""A private Redis server (Debian's `redis-server`) on a free loopback port, for the
remote cache's tests and the harness's first-call rows: started, stopped and
restarted by its owner, no persistence (a restart empties it), never a service."""
from __future__ import annotations

import contextlib
import shutil
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional


def available() -> Optional[str]:
    """The redis-server executable, or None."""
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """`redis-server` on 127.0.0.1:port, its files in `workdir`; extra arguments as
    `redis-server` takes them (("--maxmemory", "2mb"), ...)."""

    def __init__(self, workdir: Path, *extra: str, port: Optional[int] = None) -> None:
        exe = available()
        if exe is None:
            raise FileNotFoundError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.exe, self.workdir, self.extra = exe, Path(workdir), list(extra)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        log = open(self.workdir / "redis.log", "ab")
        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "no",
                                      *self.extra], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: "
                                   + (self.workdir / "redis.log").read_text()[-2000:])
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):  # answering (a password set: NOAUTH)
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def seed(server: RedisServer, cache_dir: Path) -> None:
    """Empty the server, then publish to it every tuned winner of the lazytriton cache `cache_dir`
    (`lazytriton cache clear --remote`, `lazytriton cache push`); CalledProcessError if either fails."""
    env = {**os.environ, "LAZYTRITON_REMOTE_CACHE": server.url, "LAZYTRITON_CACHE_DIR": str(cache_dir)}
    for command in (["clear", "--remote"], ["push"]):
        # Run outside any source tree, whose lazytriton/ (no C++ core built) would shadow the installed one.
        subprocess.run([sys.executable, "-m", "lazytriton", "cache", *command], env=env, check=True,
                       capture_output=True, text=True, timeout=120, cwd=str(cache_dir.parent))
