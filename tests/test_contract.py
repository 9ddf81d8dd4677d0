"""The numbers Python and C++ share come from one place: lazytriton/model/contract.py,
from which csrc/include/lazytriton/contract.h is generated (and checked in)."""
import difflib
import re
from pathlib import Path

from lazytriton.model import arrays, contract, specialize

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "include" / "lazytriton" / "contract.h"


def test_header_is_generated_from_contract():
    want, have = contract.header(), HEADER.read_text()
    if want != have:
        diff = "\n".join(difflib.unified_diff(have.splitlines(), want.splitlines(), "checked in", "generated",
                                              lineterm="", n=0))
        raise AssertionError(f"{HEADER} is not what lazytriton/model/contract.py generates; run "
                             f"`python lazytriton/model/contract.py` to regenerate it:\n{diff}")


def test_python_faces_read_the_contract():
    assert arrays.DTYPES is contract.DTYPES and arrays.DTYPE_IDS is contract.DTYPE_IDS
    assert specialize.INT_TYPES is contract.INT_TYPES and specialize.BUNDLE_OPTION_NAMES is contract.BUNDLE_OPTION_NAMES
    assert all(arrays.itemsize(d) == contract.dtype_bytes(d) for d in contract.DTYPES)


def test_no_source_restates_the_numbers():
    """No C++ source spells the shared lists out by hand again (they were restated in several files)."""
    dtype_list = re.compile(r'"u1",\s*"i8",\s*"i16"')
    options = re.compile(r'"num_warps",\s*"num_stages"')
    for path in [*(ROOT / "csrc").rglob("*.cc"), *(ROOT / "csrc").rglob("*.h")]:
        if path == HEADER:
            continue
        text = path.read_text()
        assert not dtype_list.search(text), f"{path} restates contract.DTYPES"
        assert not options.search(text), f"{path} restates contract.CPP_OPTION_NAMES"
        assert "enum Kind {" not in text, f"{path} restates contract.SLOT_KINDS"
