# The CPU kernels' x86-64-v4 (AVX-512) build: cpu/rnn_v4.c compiles rnn_layout.c, rnn_fwd.c and
# rnn_bwd.c again when KF_HAVE_CPU_V4 is defined (cpu/rnn_cpu.h), cpu/sklinear_v4.c compiles
# sklinear.c again; a context picks them at creation where the CPU runs them (cpu/isa.c). Sets
# KF_HAVE_CPU_V4 (ON where the target is x86-64 and the compiler takes -march=x86-64-v4) and
# gives those files the flag; the including build defines KF_HAVE_CPU_V4 for its library
# sources. Included by the main build and tests/fuzz.
option(KF_CPU_AVX512 "Also build the CPU recurrent and sketched-linear kernels for x86-64-v4 (AVX-512), picked at context creation where the CPU runs them" ON)
set(KF_HAVE_CPU_V4 OFF)
if(KF_CPU_AVX512 AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  include(CheckCCompilerFlag)
  check_c_compiler_flag(-march=x86-64-v4 KF_CC_HAS_MARCH_X86_64_V4)
  if(KF_CC_HAS_MARCH_X86_64_V4)
    set(KF_HAVE_CPU_V4 ON)
    set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/../cpu/rnn_v4.c
      ${CMAKE_CURRENT_LIST_DIR}/../cpu/sklinear_v4.c PROPERTIES COMPILE_OPTIONS -march=x86-64-v4)
  endif()
endif()
