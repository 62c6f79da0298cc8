"""The instruction sets a CPU benchmark ran with, for the results files (one line, shared by the
CPU bench scripts): what the CPU offers, what kfuse's own kernels were compiled for (the build's
KF_CPU_ARCH; the recurrent and SKLinear kernels also for x86-64-v4 where CMake's KF_CPU_AVX512
holds, and which of the two a context runs: the library picks at context creation, cpu/isa.c, by
the same rule as dispatched_isa below), and which kernels the OpenBLAS inside libkfuse picked at
run time (it names its core on stderr under OPENBLAS_VERBOSE=2 when a program linking libkfuse
loads; OPENBLAS_CORETYPE forces one)."""
import os
import re
import subprocess


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_isa():
    flags = cpu_flags()
    if flags is None:
        return "?"
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "AVX-512" + (" with BF16" if "avx512_bf16" in flags else "")
    if {"avx2", "fma"} <= flags:
        return "AVX2+FMA, no AVX-512"
    return "no AVX2"


def cmake_cache(build_dir, name):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            m = re.search(r"^%s:\w+=(.*)$" % re.escape(name), f.read(), re.M)
    except OSError:
        return None
    return m.group(1).strip() if m else ""


def kernel_isa(build_dir):
    arch = cmake_cache(build_dir, "KF_CPU_ARCH")
    if arch is None:
        return "?"
    return {"x86-64-v3": "x86-64-v3 (AVX2+FMA)", "": "the compiler's default"}.get(arch, arch)


AVX512_V4 = {"avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512cd"}


def dispatched_isa(build_dir, env=None):
    """What the recurrent and SKLinear kernels of the build's libkfuse run on this CPU under `env`
    (default os.environ): "x86-64-v4 (AVX-512)" where the build has those kernels and the CPU
    runs AVX-512 F, VL, BW, DQ and CD, unless KF_CPU_ISA=avx2 forces the baseline; else the
    baseline (kernel_isa). cpu/isa.c picks by this rule at context creation."""
    env = os.environ if env is None else env
    built = (cmake_cache(build_dir, "KF_CPU_AVX512") or "").upper() in ("ON", "1", "TRUE") and \
        cmake_cache(build_dir, "KF_CC_HAS_MARCH_X86_64_V4") == "1"
    flags = cpu_flags() or set()
    if built and AVX512_V4 <= flags and env.get("KF_CPU_ISA", "") != "avx2":
        return "x86-64-v4 (AVX-512)"
    return kernel_isa(build_dir)


def openblas_core(lib_user):
    """The core OpenBLAS picks in a process that loads libkfuse and no other OpenBLAS: `lib_user`
    is a command (a C driver run with --help, or Python importing only kfuse's cffi module)."""
    env = dict(os.environ, OPENBLAS_VERBOSE="2")
    try:
        r = subprocess.run(lib_user, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "?"
    m = re.search(r"^Core: (\S+)", r.stderr, re.M)
    if not m:
        return "?"
    if m.group(1) == "Prescott" and {"avx2", "fma"} <= (cpu_flags() or set()) and \
            "OPENBLAS_CORETYPE" not in os.environ:
        # OpenBLAS's fallback for a CPU it does not know; libkfuse picks again by the CPU's
        # features before its first GEMM (host/blas.c), after this load-time line
        return "re-picked by libkfuse (OpenBLAS fell back to Prescott at load)"
    return m.group(1)


def isa_line(build_dir, lib_user):
    """"CPU ...; kfuse kernels ...; OpenBLAS core ..." for a results file (build_dir: the
    CMake build of the libkfuse measured; lib_user: as for openblas_core)."""
    forced = os.environ.get("OPENBLAS_CORETYPE")
    picked = dispatched_isa(build_dir)
    return "CPU %s; kfuse's own kernels compiled for %s, its recurrent and SKLinear kernels " \
        "running %s%s; " \
        "its OpenBLAS core %s%s" % (
            cpu_isa(), kernel_isa(build_dir), picked,
            " (KF_CPU_ISA=avx2)" if os.environ.get("KF_CPU_ISA") == "avx2" else
            " (picked at context creation)",
            openblas_core(lib_user),
            " (forced by OPENBLAS_CORETYPE)" if forced else " (picked at run time)")


def driver_cmd(exe):
    """openblas_core's command for a C bench driver."""
    return [exe, "--help"]


def python_cmd(python):
    """openblas_core's command for the kfuse Python package installed for `python`."""
    return [python, "-c", "import kfuse._kfuse_cffi"]
