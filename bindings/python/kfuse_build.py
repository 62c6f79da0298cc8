"""cffi build script (out-of-line API mode) for the `kfuse` Python package.

The cdef is generated from capi/include/kfuse.h at build time, so the binding and the C ABI
cannot drift: comments, #include lines, the export macro (KF_API) and the C++ guards are stripped
mechanically, preprocessor conditionals are evaluated for a plain C compiler (nothing predefined),
and every object-like #define with a value becomes `#define NAME ...` (API mode: the C compiler
supplies the value). Struct layouts are then checked by the compiler against the real header.

The package's CMake build (CMakeLists.txt beside this file, driven by scikit-build-core) runs
    python kfuse_build.py --emit OUT.c --include-dir DIR
to write the extension's C source, and compiles it itself (on Python's limited API, abi3), linked
to the libkfuse it builds or to a prebuilt one (KFUSE_LIBRARY_DIR). `--print-cdef` prints the
cdef. cffi's generated code defines Py_LIMITED_API itself on release builds of Python.
"""
import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _eval_condition(expr, defined):
    """Evaluates a #if expression of defined(), !, &&, || and integer literals; an unknown
    identifier is 0, as the C preprocessor has it."""
    expr = re.sub(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)",
                  lambda m: "1" if (m.group(1) or m.group(2)) in defined else "0", expr)
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    expr = re.sub(r"\b[A-Za-z_]\w*\b",
                  lambda m: m.group(0) if m.group(0) in ("and", "or", "not") else "0", expr)
    return bool(eval(expr, {"__builtins__": {}}))  # only digits, operators and parentheses left


def header_to_cdef(text):
    """kfuse.h -> a cdef string cffi accepts."""
    text = _strip_comments(text).replace("\\\n", " ")
    defined = set()
    stack = []  # per open conditional: [this branch active, a branch already taken, parent active]
    active = True
    out = []
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"#\s*(\w+)\s*(.*)", s)
        if m:
            d, rest = m.group(1), m.group(2).strip()
            if d in ("if", "ifdef", "ifndef"):
                if d == "ifdef":
                    cond = rest in defined
                elif d == "ifndef":
                    cond = rest not in defined
                else:
                    cond = _eval_condition(rest, defined)
                stack.append([active and cond, cond, active])
                active = active and cond
            elif d == "elif":
                top = stack[-1]
                cond = not top[1] and _eval_condition(rest, defined)
                top[0] = top[2] and cond
                top[1] = top[1] or cond
                active = top[0]
            elif d == "else":
                top = stack[-1]
                top[0] = top[2] and not top[1]
                top[1] = True
                active = top[0]
            elif d == "endif":
                stack.pop()
                active = stack[-1][0] if stack else True
            elif d == "define" and active:
                dm = re.match(r"(\w+)(\(?)\s*(.*)", rest)
                name, funclike, value = dm.group(1), dm.group(2), dm.group(3).strip()
                defined.add(name)
                if name != "KF_API" and not funclike and value:
                    out.append("#define %s ..." % name)
            # #include, #undef, #error, #pragma: nothing for cffi
            continue
        if active and s:
            out.append(line)
    if stack:
        raise RuntimeError("unbalanced preprocessor conditionals in kfuse.h")
    cdef = "\n".join(out)
    cdef = re.sub(r"\bKF_API\b", "", cdef)
    # The array bound KF_MAX_DIMS is a `...` constant to cffi; let the compiler size the array.
    cdef = re.sub(r"\[\s*KF_\w+\s*\]", "[...]", cdef)
    return cdef + "\n"


def make_ffi(include_dir):
    """The FFI of kfuse.h in `include_dir`, its source set for out-of-line API mode."""
    header = Path(include_dir) / "kfuse.h"
    ffi = FFI()
    ffi.cdef(header_to_cdef(header.read_text()))
    ffi.set_source("kfuse._kfuse_cffi", '#include "kfuse.h"\n')
    return ffi


def main(argv):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--include-dir", default=str(HERE.parent.parent / "capi" / "include"),
                   help="the directory holding kfuse.h (default: this checkout's)")
    p.add_argument("--emit", metavar="OUT.c", help="write the extension's C source to OUT.c")
    p.add_argument("--print-cdef", action="store_true", help="print the cdef")
    a = p.parse_args(argv)
    if a.print_cdef:
        print(header_to_cdef((Path(a.include_dir) / "kfuse.h").read_text()))
    if a.emit:
        make_ffi(a.include_dir).emit_c_code(a.emit)
    if not (a.print_cdef or a.emit):
        p.error("nothing to do: give --emit OUT.c or --print-cdef")


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
