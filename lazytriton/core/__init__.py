"""The old home of `lazytriton.core.arrays`, which README once named (`DeviceArray`):
kept as an alias of `lazytriton.model.arrays`. Nothing in lazytriton imports it."""
import sys

from ..model import arrays

sys.modules[__name__ + ".arrays"] = arrays
