"""The digest of the sources a lazytriton install is built from, so that a
version venv made by setup_venvs.sh from other sources is known to be stale.
Usage: python stamp.py REPO  (prints the digest)."""
import hashlib
import sys
from pathlib import Path

PARTS = ("lazytriton", "csrc", "cmake", "CMakeLists.txt", "pyproject.toml")


def source_digest(repo: Path) -> str:
    h = hashlib.sha256()
    for part in PARTS:
        root = repo / part
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix in (".pyc", ".so"):
                continue
            h.update(str(f.relative_to(repo)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


if __name__ == "__main__":
    print(source_digest(Path(sys.argv[1]).resolve()))
