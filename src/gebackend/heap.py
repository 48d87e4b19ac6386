"""Handing the heap a load freed back to the operating system."""

from __future__ import annotations


def return_freed_memory() -> None:
    """Compiling copies the model several times; hand the freed heap back to the OS (glibc's malloc_trim).

    Measured on a 42 MiB BERT with 8 buckets: the instance's RSS 983 MiB without it, 232 MiB with it.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
