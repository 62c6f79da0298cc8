/* The default thread count of a context (kf_context_desc.num_threads = 0): the CPUs this process
 * may actually use, not the machine's online cores. The smallest of
 *  - omp_get_max_threads() (OMP_NUM_THREADS, or the runtime's own default),
 *  - the CPUs in the process's affinity mask (sched_getaffinity: taskset, numactl, a container's
 *    cpuset), read at each context creation, so a mask set after the OpenMP runtime started
 *    still counts,
 *  - the cgroup v2 CPU quota where one is set (/sys/fs/cgroup/cpu.max "quota period", rounded
 *    up: a container limited to 1.5 CPUs gets 2 threads),
 * at least 1. Threads beyond what the process may run would only time-slice against each other
 * (and, spinning, against the BLAS). */
#define _GNU_SOURCE
#include "core.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>

/* ceil(quota / period) from cpu.max, or 0 when there is none ("max", no file, unreadable). */
static int32_t kf__cgroup_cpus(void) {
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f == NULL) return 0;
    long long quota = 0, period = 0;
    const int got = fscanf(f, "%lld %lld", &quota, &period);
    fclose(f);
    if (got != 2 || quota <= 0 || period <= 0) return 0;
    const long long n = (quota + period - 1) / period;
    return n > 4096 ? 4096 : (int32_t)n;
}

int32_t kf__default_threads(void) {
    int32_t n = omp_get_max_threads();
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int32_t mask = CPU_COUNT(&set);
        if (mask >= 1 && mask < n) n = mask;
    }
    const int32_t quota = kf__cgroup_cpus();
    if (quota >= 1 && quota < n) n = quota;
    return n >= 1 ? (n <= 4096 ? n : 4096) : 1;
}
