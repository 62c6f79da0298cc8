"""The cffi binding declares all of kfuse.h: every function the header declares with KF_API, every
enumerator and every object-like KF_ macro with a value is an attribute of the extension's `lib`.
The cdef comes from the C compiler's preprocessor (bindings/python/kfuse_build.py); a declaration
it lost would build and import, and fail only when called. The names are read here the way
tests/abi/check_symbols.sh reads the functions."""
import re
from pathlib import Path

from kfuse._lowlevel import ffi, lib

HEADER = Path(__file__).resolve().parents[2] / "capi" / "include" / "kfuse.h"


def _declared():
    text = HEADER.read_text()
    functions = re.findall(r"^KF_API [^(]*\b(kf_[a-z0-9_]+)\(", text, re.M)
    enumerators = re.findall(r"^\s+(KF_[A-Z0-9_]+)\s*=", text, re.M)
    macros = [m for m in re.findall(r"^\s*#\s*define\s+(KF_\w+)[ \t]+\S", text, re.M)
              if m != "KF_API"]
    return functions, enumerators, macros


def test_every_declaration_is_bound():
    functions, enumerators, macros = _declared()
    # the header as it is (1.7.5): 64 functions, 24 enumerators, 10 macros; the API only grows
    assert len(functions) >= 64 and len(enumerators) >= 24 and len(macros) >= 10
    missing = [n for n in functions + enumerators + macros if not hasattr(lib, n)]
    assert not missing, "kfuse.h declares, the cffi binding lacks: %s" % ", ".join(missing)


def test_values_come_from_the_compiler():
    # API mode: the macros' values are the compiled header's, and kf_tensor's arrays its size
    assert lib.KF_VERSION_NUMBER == lib.kf_version()
    assert len(ffi.new("kf_tensor *").shape) == lib.KF_MAX_DIMS
