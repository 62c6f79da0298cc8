/* fmnist_data.h: reader for the Fashion-MNIST IDX files (gzip-compressed, as Debian's
 * dataset-fashion-mnist package installs them under /usr/share/datasets/fashion-mnist/). */
#ifndef KF_EXAMPLES_FMNIST_DATA_H
#define KF_EXAMPLES_FMNIST_DATA_H

#include <stddef.h>
#include <stdint.h>

#define FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define FMNIST_ROWS 28
#define FMNIST_COLS 28
#define FMNIST_PIXELS (FMNIST_ROWS * FMNIST_COLS)
#define FMNIST_CLASSES 10

/* One split: `count` images of 28x28 raw bytes (0..255, row-major) and their labels (0..9). */
typedef struct fmnist_split {
    int64_t count;
    uint8_t *images; /* [count, 784] */
    uint8_t *labels; /* [count] */
} fmnist_split;

/* Loads "<dir>/<name>-images-idx3-ubyte.gz" and "<dir>/<name>-labels-idx1-ubyte.gz" (name is
 * "train" or "t10k"). Returns 0 on success. On failure returns -1, leaves `out` empty and writes
 * a one-line reason naming the offending file into err[0..err_size). */
int fmnist_load(const char *dir, const char *name, fmnist_split *out, char *err, size_t err_size);

/* Frees what fmnist_load() allocated; accepts an empty split. */
void fmnist_free(fmnist_split *split);

/* The ten class names, index = label. */
extern const char *const fmnist_class_names[FMNIST_CLASSES];

#endif
