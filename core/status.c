/* Status codes, their static strings, and the thread-local detail message (SQLite's errstr /
 * errmsg split): kf_status_string() is static text, kf_last_error_message() is the latest
 * failure's detail on this thread, cleared by every successful public call. */
#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define KF__MESSAGE_BYTES 512

static _Thread_local char kf__message[KF__MESSAGE_BYTES];

KF_API const char *kf_status_string(kf_status status) {
    switch (status) {
    case KF_OK: return "KF_OK: success";
    case KF_ERR_INVALID_ARGUMENT: return "KF_ERR_INVALID_ARGUMENT: invalid argument";
    case KF_ERR_UNSUPPORTED: return "KF_ERR_UNSUPPORTED: not supported by this build or backend";
    case KF_ERR_OUT_OF_MEMORY: return "KF_ERR_OUT_OF_MEMORY: out of memory";
    case KF_ERR_WORKSPACE_TOO_SMALL: return "KF_ERR_WORKSPACE_TOO_SMALL: workspace or reserve too small";
    case KF_ERR_BACKEND_UNAVAILABLE: return "KF_ERR_BACKEND_UNAVAILABLE: backend unavailable";
    case KF_ERR_DEVICE: return "KF_ERR_DEVICE: device (CUDA) error";
    case KF_ERR_INTERNAL: return "KF_ERR_INTERNAL: internal error";
    }
    return "KF_ERR_UNKNOWN: unknown status code";
}

KF_API const char *kf_last_error_message(void) { return kf__message; }

void kf__clear_error(void) { kf__message[0] = '\0'; }

kf_status kf__error(kf_status status, const char *fn, const char *fmt, ...) {
    int n = snprintf(kf__message, sizeof kf__message, "%s: ", fn);
    if (n < 0 || (size_t)n >= sizeof kf__message) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kf__message + n, sizeof kf__message - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

kf_status kf__read_struct(const char *fn, const char *arg, const void *s, size_t oldest_size,
                          size_t known_size, void *out) {
    KF_CHECK_FN(fn, s != NULL, KF_ERR_INVALID_ARGUMENT, "%s is NULL", arg);
    size_t given = *(const size_t *)s;
    KF_CHECK_FN(fn, given >= oldest_size, KF_ERR_INVALID_ARGUMENT,
                "%s->struct_size = %zu, expected at least %zu (fill it with the matching "
                "*_init())", arg, given, oldest_size);
    /* A newer caller's struct: usable only if every field we do not know is zero. */
    const unsigned char *bytes = (const unsigned char *)s;
    for (size_t i = known_size; i < given; ++i)
        KF_CHECK_FN(fn, bytes[i] == 0, KF_ERR_UNSUPPORTED,
                    "%s->struct_size = %zu: byte %zu beyond this library's %zu-byte layout is "
                    "set; a newer kfuse is needed", arg, given, i, known_size);
    if (out != NULL) memcpy(out, s, given < known_size ? given : known_size);
    return KF_OK;
}

kf_status kf__check_struct_size(const char *fn, const char *arg, const void *s, size_t known_size) {
    return kf__read_struct(fn, arg, s, known_size, known_size, NULL);
}
