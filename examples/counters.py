#!/usr/bin/env python3
"""Publish application counters for `virtprof agent` (layout in docs/agent.md).

    python3 examples/counters.py /run/virtprof/counters/demo.counters

counts `ticks` ten times a second until stopped; `virtprof agent --counters DIR` sends it as
the series app.demo.ticks. Python has no atomic add on shared memory: one writer per counter.
"""
import mmap
import struct
import sys
import time

SLOT, NAME = 64, 48


def create(path, app, names):
    size = SLOT * (len(names) + 1)
    with open(path, "w+b") as f:
        f.truncate(size)
        m = mmap.mmap(f.fileno(), size)
    m[8:16] = struct.pack("<II", 1, len(names))
    m[16:16 + NAME] = app.encode()[:NAME - 1].ljust(NAME, b"\0")
    for i, name in enumerate(names):
        at = SLOT * (i + 1)
        m[at:at + NAME] = name.encode()[:NAME - 1].ljust(NAME, b"\0")
    m[0:8] = b"VPCOUNT1"  # last: the file is ready
    return m


def add(m, i, n=1):
    at = SLOT * (i + 1) + 56
    (value,) = struct.unpack_from("<Q", m, at)
    struct.pack_into("<Q", m, at, value + n)


if __name__ == "__main__":
    counters = create(sys.argv[1], "demo", ["ticks"])
    while True:
        add(counters, 0)
        time.sleep(0.1)
