# Locates the OpenBLAS that kfuse links: Debian's threaded build, as a static archive.
# Sets KF_BLAS_INCLUDE_DIR, KF_BLAS_STATIC_LIB and KF_GFORTRAN_LIB; shared by the main build and
# the standalone fuzz build (tests/fuzz) so the two can never link different BLAS builds.
#
# OpenBLAS, linked statically and hidden inside libkfuse, so a process that also loads another
# OpenBLAS (numpy's) neither gets ours nor hands us its own. kfuse calls GEMM from its own OpenMP
# threads, concurrently, and pins this copy to one thread (cpu/blas.c) so BLAS never wakes workers
# that spin against ours. It is Debian's threaded build on purpose: the serial build lacks the
# locking that concurrent callers need (two threads in sgemm at once return wrong results).
find_path(KF_BLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/aarch64-linux-gnu/openblas-pthread
  NO_DEFAULT_PATH)
find_library(KF_BLAS_STATIC_LIB NAMES libopenblas.a
  PATHS /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/aarch64-linux-gnu/openblas-pthread
  NO_DEFAULT_PATH)
# The LAPACK half of the archive (dgelsd, for the KAN grid update) is gfortran code that calls into
# the gfortran runtime; libgfortran5 is a dependency of Debian's OpenBLAS packages, so its shared
# library is present wherever the archive is.
find_library(KF_GFORTRAN_LIB NAMES libgfortran.so.5 gfortran
  PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu)
if(NOT KF_BLAS_INCLUDE_DIR OR NOT KF_BLAS_STATIC_LIB OR NOT KF_GFORTRAN_LIB)
  message(FATAL_ERROR "threaded OpenBLAS not found: apt-get install libopenblas-pthread-dev")
endif()
find_package(Threads REQUIRED)
