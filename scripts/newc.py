#!/usr/bin/env python3
"""Write the folder DIR as a newc cpio archive (what the kernel unpacks as an initramfs) to
standard output: folders, files and symbolic links, owned by root, in a stable order.

    python3 scripts/newc.py DIR | gzip -1 > initrd.gz
"""
import os
import stat
import sys


def main(root):
    out = sys.stdout.buffer
    ino = 0

    def entry(name, st, content):
        nonlocal ino
        ino += 1
        fields = [ino, st.st_mode if st else 0, 0, 0, 1, 0, len(content), 0, 0, 0, 0, len(name) + 1, 0]
        head = b"070701" + "".join("%08X" % v for v in fields).encode() + name.encode() + b"\0"
        out.write(head + b"\0" * (-len(head) % 4) + content + b"\0" * (-len(content) % 4))

    for base, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(base, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                entry(rel, st, os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    entry(rel, st, f.read())
            else:
                entry(rel, st, b"")
    entry("TRAILER!!!", None, b"")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: newc.py DIR > ARCHIVE")
    main(sys.argv[1])
