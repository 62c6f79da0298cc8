# Locates the BLAS and LAPACK kfuse links. Sets KF_BLAS_INCLUDE_DIR (cblas.h), KF_BLAS_LIBRARIES
# (what to link) and KF_BLAS_KIND ("private-static" or "FindBLAS"); shared by the main build and
# the standalone fuzz build (tests/fuzz) so the two can never link different BLAS builds.
#
# The default, wherever it exists: Debian's threaded OpenBLAS as a static archive, linked into
# libkfuse and hidden there, so a process that also loads another OpenBLAS (numpy's) neither gets
# ours nor hands us its own. kfuse calls GEMM from its own OpenMP threads, concurrently, and pins
# this copy to one thread (cpu/blas.c) so BLAS never wakes workers that spin against ours. It is
# the threaded build on purpose: the serial build lacks the locking that concurrent callers need
# (two threads in sgemm at once return wrong results). Its LAPACK half (dgelsd, for the KAN grid
# update) is gfortran code: libgfortran5 is a dependency of Debian's OpenBLAS packages, so its
# shared library is present wherever the archive is.
#
# Elsewhere: CMake's FindBLAS and FindLAPACK with BLA_VENDOR=OpenBLAS (cpu/blas.c calls OpenBLAS's
# openblas_set_num_threads). That OpenBLAS is shared and process-wide: pinning it to one thread
# pins it for the whole process, and it must be a build with locking (USE_LOCKING or threaded).
find_package(Threads REQUIRED)
find_path(KF_BLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/aarch64-linux-gnu/openblas-pthread
  NO_DEFAULT_PATH)
find_library(KF_BLAS_STATIC_LIB NAMES libopenblas.a
  PATHS /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/aarch64-linux-gnu/openblas-pthread
  NO_DEFAULT_PATH)
find_library(KF_GFORTRAN_LIB NAMES libgfortran.so.5 gfortran
  PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu)
if(KF_BLAS_INCLUDE_DIR AND KF_BLAS_STATIC_LIB AND KF_GFORTRAN_LIB)
  set(KF_BLAS_KIND private-static)
  set(KF_BLAS_LIBRARIES ${KF_BLAS_STATIC_LIB} ${KF_GFORTRAN_LIB})
else()
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS)
  find_package(LAPACK)
  unset(KF_BLAS_INCLUDE_DIR CACHE)
  find_path(KF_BLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
  if(NOT BLAS_FOUND OR NOT LAPACK_FOUND OR NOT KF_BLAS_INCLUDE_DIR)
    message(FATAL_ERROR "OpenBLAS not found: apt-get install libopenblas-pthread-dev (the private "
                        "static copy), or an OpenBLAS that FindBLAS/FindLAPACK find (BLA_VENDOR=OpenBLAS)")
  endif()
  set(KF_BLAS_KIND FindBLAS)
  set(KF_BLAS_LIBRARIES BLAS::BLAS LAPACK::LAPACK)
endif()
message(STATUS "kfuse BLAS/LAPACK: ${KF_BLAS_KIND} (${KF_BLAS_LIBRARIES})")
