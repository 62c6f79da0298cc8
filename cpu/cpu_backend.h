/* The CPU backend's op tables, one per op file (cpu/rnn_layout.c, cpu/sklinear.c,
 * cpu/kan_linear.c), gathered into its kf__backend by cpu/backend.c. Private to cpu/. */
#ifndef KF_CPU_BACKEND_H
#define KF_CPU_BACKEND_H

#include "backend.h"
#include "kan_backend.h"
#include "rnn_backend.h"
#include "sklinear_backend.h"

extern const kf__rnn_ops kf__cpu_rnn_ops;
extern const kf__skl_ops kf__cpu_skl_ops;
extern const kf__kan_ops kf__cpu_kan_ops;

#endif /* KF_CPU_BACKEND_H */
