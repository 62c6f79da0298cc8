/* Run-time version: the numbers come from kfuse.h, the single source of truth (the build also
 * parses them from there for the SONAME and package version). */
#include "front.h"

#define KF__STR2(x) #x
#define KF__STR(x) KF__STR2(x)

KF_API uint32_t kf_version(void) { return KF_VERSION_NUMBER; }

KF_API const char *kf_version_string(void) {
    return KF__STR(KF_VERSION_MAJOR) "." KF__STR(KF_VERSION_MINOR) "." KF__STR(KF_VERSION_PATCH);
}
