"""cffi build script (out-of-line API mode) for the `kfuse` Python package.

The cdef is generated from capi/include/kfuse.h at build time, so the binding and the C ABI
cannot drift. The C compiler's own preprocessor reads the header (`cc -E -dD -undef`: as a plain
C compiler with nothing predefined, so the export macro KF_API is empty and the C++ guards are
gone); what it gives for kfuse.h itself is the cdef, with every object-like #define that has a
value as `#define NAME ...` (API mode: the C compiler supplies the value). Struct layouts are
then checked by the compiler against the real header.

The package's CMake build (CMakeLists.txt beside this file, driven by scikit-build-core) runs
    python kfuse_build.py --emit OUT.c --include-dir DIR --cc CMAKE_C_COMPILER
to write the extension's C source, and compiles it itself (on Python's limited API, abi3), linked
to the libkfuse it builds or to a prebuilt one (KFUSE_LIBRARY_DIR). Without --cc the compiler is
$CC, else cc (GCC or Clang: they take -E -dD). `--print-cdef` prints the cdef. cffi's generated
code defines Py_LIMITED_API itself on release builds of Python.
"""
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

# The headers kfuse.h includes. cffi knows their types (size_t, int64_t, ...) itself, so they are
# preprocessed as empty files: the system's would bring compiler extensions that cffi cannot parse.
_SYSTEM_HEADERS = ("stddef.h", "stdint.h")


def find_compiler(cc=None):
    """The C compiler command (a list) that preprocesses kfuse.h: `cc` (a command line, e.g. the
    CMake build's CMAKE_C_COMPILER), else $CC, else `cc` on PATH."""
    cmd = shlex.split(cc or os.environ.get("CC") or "cc")
    if not cmd or not shutil.which(cmd[0]):
        raise RuntimeError(
            "kfuse_build.py: no C compiler to preprocess kfuse.h: %r is not found; pass --cc "
            "COMPILER or set CC to a GCC- or Clang-compatible compiler (one that takes -E -dD)"
            % (cmd[0] if cmd else cc))
    return cmd


def preprocess(header, cc=None):
    """kfuse.h run through the C compiler's preprocessor as a plain C compiler with nothing
    predefined (-undef: no __GNUC__, so KF_API is empty), its #defines kept (-dD), its system
    headers empty. Returns the output as text, with the compiler's line markers."""
    cmd = find_compiler(cc)
    with tempfile.TemporaryDirectory() as stub:
        for name in _SYSTEM_HEADERS:
            Path(stub, name).write_text("/* cffi declares this header's types itself */\n")
        run = subprocess.run(cmd + ["-E", "-dD", "-undef", "-nostdinc", "-I", stub, "-x", "c",
                                    str(header)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
    if run.returncode != 0:
        raise RuntimeError("kfuse_build.py: `%s` failed (exit %d):\n%s"
                           % (" ".join(cmd + ["-E", "...", str(header)]), run.returncode,
                              run.stderr))
    return run.stdout


def header_to_cdef(header, cc=None):
    """kfuse.h -> a cdef string cffi accepts: the preprocessor's output for kfuse.h itself (the
    line markers name the file each line comes from), with every object-like #define that has a
    value as `#define NAME ...` (API mode: the C compiler supplies the value)."""
    header = Path(header).resolve()
    out = []
    in_header = False
    for line in preprocess(header, cc).splitlines():
        marker = re.match(r'#\s*\d+\s+"(.*)"', line)
        if marker:
            in_header = Path(marker.group(1)).resolve() == header
        elif in_header:
            define = re.match(r"#\s*define\s+(\w+)(\(?)\s*(\S?)", line)
            if define:
                if not define.group(2) and define.group(3):
                    out.append("#define %s ..." % define.group(1))
            elif line.strip() and not line.startswith("#"):
                out.append(line)
    if not out:
        raise RuntimeError("kfuse_build.py: the preprocessor gave no declaration from %s" % header)
    return "\n".join(out) + "\n"


def make_ffi(include_dir, cc=None):
    """The FFI of kfuse.h in `include_dir`, its source set for out-of-line API mode."""
    ffi = FFI()
    ffi.cdef(header_to_cdef(Path(include_dir) / "kfuse.h", cc))
    ffi.set_source("kfuse._kfuse_cffi", '#include "kfuse.h"\n')
    return ffi


def main(argv):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--include-dir", default=str(HERE.parent.parent / "capi" / "include"),
                   help="the directory holding kfuse.h (default: this checkout's)")
    p.add_argument("--emit", metavar="OUT.c", help="write the extension's C source to OUT.c")
    p.add_argument("--print-cdef", action="store_true", help="print the cdef")
    p.add_argument("--cc", metavar="COMPILER",
                   help="the C compiler that preprocesses kfuse.h, GCC- or Clang-compatible "
                        "(default: $CC, else cc)")
    a = p.parse_args(argv)
    if not (a.print_cdef or a.emit):
        p.error("nothing to do: give --emit OUT.c or --print-cdef")
    try:
        if a.print_cdef:
            print(header_to_cdef(Path(a.include_dir) / "kfuse.h", a.cc))
        if a.emit:
            make_ffi(a.include_dir, a.cc).emit_c_code(a.emit)
    except RuntimeError as e:
        raise SystemExit(str(e))

if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
