"""Fashion-MNIST from Debian's dataset-fashion-mnist package (gzip'd IDX files under
/usr/share/datasets/fashion-mnist): the data of kfuse's Python examples and benches. numpy only;
nothing is downloaded."""
import gzip
import os
import struct

import numpy as np

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """A gzip'd IDX file as a numpy uint8 array (big-endian header: magic, then one u32 per dim)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError("%s: %d bytes of data, expected %d" % (path, arr.size, np.prod(dims)))
    return arr.reshape(dims)


def load(split, data_dir=DATA_DIR):
    """(images [N, 28, 28] uint8, labels [N] uint8) of the "train" (60,000) or "test" (10,000)
    split. Raises OSError / ValueError with the path when the files are missing or malformed."""
    prefix = "train" if split == "train" else "t10k"
    return (read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz")),
            read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz")))
