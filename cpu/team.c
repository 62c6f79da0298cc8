#include "team.h"

#include <omp.h>

void kf__cpu_team(int32_t ns, void (*fn)(void *arg, int tid, int nth), void *arg) {
    if (ns <= 1) {
        fn(arg, 0, 1);
        return;
    }
#pragma omp parallel num_threads(ns)
    fn(arg, omp_get_thread_num(), omp_get_num_threads());
}
