# The cffi extension is declared here because setuptools' pyproject.toml tables cannot name
# cffi_modules; everything else lives in pyproject.toml. Build-time environment: see
# kfuse_build.py (KFUSE_INCLUDE_DIR, KFUSE_LIBRARY_DIR).
from setuptools import setup

setup(cffi_modules=["kfuse_build.py:ffibuilder"])
