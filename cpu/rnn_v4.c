/* The recurrent kernels for x86-64-v4 (AVX-512): rnn_layout.c, rnn_fwd.c and rnn_bwd.c compiled
 * again from the same source, CMake giving this file -march=x86-64-v4 (KF__RNN_V4 names their
 * cross-file symbols *_v4; rnn_simd.h: vectors of 16 floats, tiles for 32 registers). Empty where
 * the build has no such kernels. */
#ifdef KF_HAVE_CPU_V4
#define KF__RNN_V4
#include "rnn_layout.c"
#include "rnn_fwd.c"
#include "rnn_bwd.c"
#endif
