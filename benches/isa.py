"""The instruction sets a CPU benchmark ran with, for the results files (one line, shared by the
CPU bench scripts): what the CPU offers, what kfuse's own kernels were compiled for (the build's
KF_CPU_ARCH; they have no AVX-512 code path yet), and which kernels the OpenBLAS inside libkfuse
picked at run time (it names its core on stderr under OPENBLAS_VERBOSE=2 when a program linking
libkfuse loads; OPENBLAS_CORETYPE forces one)."""
import os
import re
import subprocess


def cpu_isa():
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return "?"
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "AVX-512" + (" with BF16" if "avx512_bf16" in flags else "")
    if {"avx2", "fma"} <= flags:
        return "AVX2+FMA, no AVX-512"
    return "no AVX2"


def kernel_isa(build_dir):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            m = re.search(r"^KF_CPU_ARCH:\w+=(.*)$", f.read(), re.M)
    except OSError:
        return "?"
    arch = m.group(1).strip() if m else ""
    return {"x86-64-v3": "x86-64-v3 (AVX2+FMA)", "": "the compiler's default"}.get(arch, arch)


def openblas_core(lib_user):
    """The core OpenBLAS picks in a process that loads libkfuse and no other OpenBLAS: `lib_user`
    is a command (a C driver run with --help, or Python importing only kfuse's cffi module)."""
    env = dict(os.environ, OPENBLAS_VERBOSE="2")
    try:
        r = subprocess.run(lib_user, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "?"
    m = re.search(r"^Core: (\S+)", r.stderr, re.M)
    return m.group(1) if m else "?"


def isa_line(build_dir, lib_user):
    """"CPU ...; kfuse kernels ...; OpenBLAS core ..." for a results file (build_dir: the
    CMake build of the libkfuse measured; lib_user: as for openblas_core)."""
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return "CPU %s; kfuse's own kernels compiled for %s; its OpenBLAS core %s%s" % (
        cpu_isa(), kernel_isa(build_dir), openblas_core(lib_user),
        " (forced by OPENBLAS_CORETYPE)" if forced else " (picked at run time)")


def driver_cmd(exe):
    """openblas_core's command for a C bench driver."""
    return [exe, "--help"]


def python_cmd(python):
    """openblas_core's command for the kfuse Python package installed for `python`."""
    return [python, "-c", "import kfuse._kfuse_cffi"]
