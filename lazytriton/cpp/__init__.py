"""The C++ face: bundles of tuned winners for C++ programs (bundle.py), typed C++
launch stubs (export.py) and what lazy mode calls in its embedded Python (embed.py)."""
from .bundle import Bundle

__all__ = ["Bundle"]
