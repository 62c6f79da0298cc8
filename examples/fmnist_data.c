/* fmnist_data.c: IDX reader for Fashion-MNIST through zlib (gzopen/gzread). Every header field
 * is checked, the payload must be exactly as long as the header says, and the gzip trailer (CRC)
 * is verified by reading to the end, so a truncated or corrupt file is reported, never used. */
#include "fmnist_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

const char *const fmnist_class_names[FMNIST_CLASSES] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* "path: reason"; zlib's gzerror() text already starts with the path. */
static void report_gz(char *err, size_t err_size, const char *path, const char *msg,
                      const char *fallback) {
    if (!msg || !*msg) snprintf(err, err_size, "%s: %s", path, fallback);
    else if (!strncmp(msg, path, strlen(path))) snprintf(err, err_size, "%s", msg);
    else snprintf(err, err_size, "%s: %s", path, msg);
}

/* Reads exactly n bytes; returns 0, or -1 with a reason in err. */
static int read_exact(gzFile f, void *dst, size_t n, const char *path, char *err, size_t err_size) {
    unsigned char *p = (unsigned char *)dst;
    while (n > 0) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int got = gzread(f, p, chunk);
        if (got <= 0) {
            int zerr = Z_OK;
            const char *msg = gzerror(f, &zerr);
            report_gz(err, err_size, path, (got < 0 || zerr != Z_OK) ? msg : NULL,
                      "unexpected end of file (truncated?)");
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Opens an IDX file, checks its magic (0x0801 labels, 0x0803 images) and reads the dims. */
static gzFile open_idx(const char *path, uint32_t magic, uint32_t *dims, int ndims, char *err,
                       size_t err_size) {
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "%s: cannot open (%s)", path, errno ? strerror(errno) : "zlib error");
        return NULL;
    }
    gzbuffer(f, 1u << 17);
    unsigned char hdr[16];
    if (read_exact(f, hdr, (size_t)(4 + 4 * ndims), path, err, err_size) != 0) {
        gzclose(f);
        return NULL;
    }
    if (be32(hdr) != magic) {
        snprintf(err, err_size, "%s: bad IDX magic 0x%08x, expected 0x%08x", path, be32(hdr), magic);
        gzclose(f);
        return NULL;
    }
    for (int i = 0; i < ndims; ++i) dims[i] = be32(hdr + 4 + 4 * i);
    return f;
}

/* After the payload: nothing may follow, and the gzip trailer must check out. */
static int check_end(gzFile f, const char *path, char *err, size_t err_size) {
    unsigned char extra;
    int got = gzread(f, &extra, 1);
    int zerr = Z_OK;
    const char *msg = gzerror(f, &zerr);
    if (got < 0 || zerr != Z_OK) {
        report_gz(err, err_size, path, msg, "corrupt gzip stream");
        return -1;
    }
    if (got > 0) {
        snprintf(err, err_size, "%s: trailing data after the IDX payload", path);
        return -1;
    }
    return 0;
}

int fmnist_load(const char *dir, const char *name, fmnist_split *out, char *err, size_t err_size) {
    char ipath[4096], lpath[4096];
    memset(out, 0, sizeof *out);
    snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, name);
    snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, name);

    uint32_t idims[3], ldims[1];
    gzFile fi = open_idx(ipath, 0x00000803u, idims, 3, err, err_size);
    if (!fi) return -1;
    if (idims[1] != FMNIST_ROWS || idims[2] != FMNIST_COLS || idims[0] == 0 || idims[0] > 10000000u) {
        snprintf(err, err_size, "%s: header says %u images of %ux%u, expected 28x28 images", ipath,
                 idims[0], idims[1], idims[2]);
        gzclose(fi);
        return -1;
    }
    size_t n = idims[0];
    uint8_t *images = (uint8_t *)malloc(n * FMNIST_PIXELS);
    uint8_t *labels = (uint8_t *)malloc(n);
    if (!images || !labels) {
        snprintf(err, err_size, "%s: out of memory for %zu images", ipath, n);
        goto fail_i;
    }
    if (read_exact(fi, images, n * FMNIST_PIXELS, ipath, err, err_size) != 0) goto fail_i;
    if (check_end(fi, ipath, err, err_size) != 0) goto fail_i;
    gzclose(fi);

    gzFile fl = open_idx(lpath, 0x00000801u, ldims, 1, err, err_size);
    if (!fl) goto fail;
    if (ldims[0] != n) {
        snprintf(err, err_size, "%s: %u labels, but %s has %zu images", lpath, ldims[0], ipath, n);
        gzclose(fl);
        goto fail;
    }
    if (read_exact(fl, labels, n, lpath, err, err_size) != 0 || check_end(fl, lpath, err, err_size) != 0) {
        gzclose(fl);
        goto fail;
    }
    gzclose(fl);
    for (size_t i = 0; i < n; ++i) {
        if (labels[i] >= FMNIST_CLASSES) {
            snprintf(err, err_size, "%s: label %u at index %zu is out of range 0..9", lpath, labels[i], i);
            goto fail;
        }
    }
    out->count = (int64_t)n;
    out->images = images;
    out->labels = labels;
    return 0;

fail_i:
    gzclose(fi);
fail:
    free(images);
    free(labels);
    return -1;
}

void fmnist_free(fmnist_split *split) {
    free(split->images);
    free(split->labels);
    memset(split, 0, sizeof *split);
}
