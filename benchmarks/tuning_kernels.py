"""The 9-config row softmax of the tuning-quality rows, kept importable under
its old name; the kernel lives in the harness (lazytriton/bench/kernels.py)."""
from lazytriton.bench.kernels import SOFTMAX_ROWS_CONFIGS as SOFTMAX_CONFIGS  # noqa: F401
from lazytriton.bench.kernels import softmax_rows as softmax  # noqa: F401
