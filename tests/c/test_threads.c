/* The default thread count (kf_context_desc.num_threads = 0) follows the process's affinity mask,
 * not the machine's online cores. The count is observed through the CPU recurrent layer's
 * workspace, which holds one state slice per thread (min(threads, B) of them): with the mask
 * restricted to one CPU, a default context must size its workspace exactly as a context asked
 * for one thread does. The restriction happens in a child process, so the test runner's own mask
 * is left alone. */
#define _GNU_SOURCE
#include "kf_test.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

/* Workspace bytes of a GRU forward (I = 3, H = 16, T = 4, B = 5: an odd batch, so that two
 * slices hold more rows than one) on a CPU context with `num_threads` (0: the default). */
static size_t gru_workspace(int32_t num_threads) {
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = num_threads;
    kf_context *ctx = NULL;
    if (kf_context_create(&cd, &ctx) != KF_OK) return 0;
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.input_size = 3, d.hidden_size = 16;
    kf_rnn_plan *p = NULL;
    size_t ws = 0;
    if (kf_rnn_plan_create(ctx, &d, &p) == KF_OK)
        (void)kf_rnn_workspace_size(p, 4, 5, KF_MODE_INFERENCE, &ws, NULL);
    kf_rnn_plan_destroy(p);
    kf_context_destroy(ctx);
    return ws;
}

Test(threads, default_follows_the_affinity_mask) {
    cpu_set_t mask;
    cr_assert_eq(sched_getaffinity(0, sizeof mask, &mask), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
        if (CPU_ISSET(c, &mask)) first = c;
    cr_assert_geq(first, 0);
    const size_t one = gru_workspace(1), two = gru_workspace(2);
    cr_assert(one > 0 && two > 0, "workspace queries failed: %s", kf_last_error_message());
    if (one == two) cr_skip_test("the workspace does not depend on the thread count here");

    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork failed");
    if (pid == 0) {
        /* Child: one CPU only; exit 0 when the default context sizes as a one-thread one. */
        cpu_set_t only;
        CPU_ZERO(&only);
        CPU_SET(first, &only);
        if (sched_setaffinity(0, sizeof only, &only) != 0) _exit(2);
        _exit(gru_workspace(0) == one ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child did not exit normally");
    cr_expect_eq(WEXITSTATUS(status), 0,
                 "under a one-CPU affinity mask the default context did not size its work for one "
                 "thread (child exit %d; 2 = sched_setaffinity failed)", WEXITSTATUS(status));
}

Test(threads, default_uses_at_most_the_affinity_mask) {
    /* Without restriction: the default is at most the mask's CPUs, so its workspace is that of
     * some explicit count 1..CPU_COUNT(mask). */
    cpu_set_t mask;
    cr_assert_eq(sched_getaffinity(0, sizeof mask, &mask), 0);
    const int n = CPU_COUNT(&mask);
    const size_t dflt = gru_workspace(0);
    int match = 0;
    for (int t = 1; t <= n && t <= 64; ++t) match |= gru_workspace(t) == dflt;
    cr_expect(match, "the default context's workspace matches no thread count 1..%d", n);
}
