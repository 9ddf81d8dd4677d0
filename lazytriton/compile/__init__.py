"""Compiling candidate configs: the compiler (in this process or the compile
server's forked children) and the targets it compiles for."""
from .targets import default_target, device_target, target_for

__all__ = ["default_target", "device_target", "target_for"]
