#!/usr/bin/env bash
# Build an initramfs that runs a (stripped) copy of BINARY inside a guest and powers off: the
# binary at /virtprof, the shared libraries `ldd` names (none for the static binary of
# scripts/package.sh), and run-init.c as /init. The command
# line comes from the kernel command line, after `--`, e.g.
#   bash scripts/debian-kernel/guest-initrd.sh target/release/virtprof /tmp/noise.cpio
#   qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1G -nographic -no-reboot \
#     -kernel target/debian-kernel/vmlinuz -initrd /tmp/noise.cpio \
#     -append 'console=ttyS0 quiet -- /virtprof noise --cpus 1 --duration 1s --json'
# The output sits between the lines VIRTPROF-RUN-BEGIN and VIRTPROF-RUN-END status=N.
# MODULES="virtio_pci virtio_console" adds those modules (with what they depend on) from the
# kernel package that scripts/nested-svm/bed.sh unpacks (boot that package's kernel: `bed.sh
# kernel` prints its folder); init loads them before the command runs. FILES="SRC:DEST ..."
# copies more files in (DEST relative to the root, in an existing folder such as tmp; programs
# keep their exec bit).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
binary=$(realpath "${1:?usage: guest-initrd.sh BINARY OUT.cpio}")
out=$(realpath -m "${2:?usage: guest-initrd.sh BINARY OUT.cpio}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -Os -static -o "$work/init" "$here/run-init.c"
objcopy --strip-all "$binary" "$work/virtprof"
# Every library a dynamic binary loads, at the path the loader looks for it (none for a
# static one: scripts/package.sh's binary goes in alone).
if ldd "$binary" >/dev/null 2>&1; then
    ldd "$binary" | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }' > "$work/libs"
else
    : > "$work/libs"
fi
: > "$work/modules"
if [ -n "${MODULES:-}" ]; then
    kernel=$(bash "$here/../nested-svm/bed.sh" kernel)
    # shellcheck disable=SC2086
    bash "$here/../nested-svm/bed.sh" modules "$kernel/kernel/lib/modules" $MODULES > "$work/modules"
fi
python3 - "$work" "$out" "${FILES:-}" <<'PY'
import os, sys
work, out, files = sys.argv[1:4]
ino = [0]
def entry(name, mode, content=b""):
    ino[0] += 1
    fields = [ino[0], mode, 0, 0, 1, 0, len(content), 0, 0, 0, 0, len(name) + 1, 0]
    b = b"070701" + "".join("%08X" % v for v in fields).encode() + name.encode() + b"\0"
    b += b"\0" * (-len(b) % 4)
    return b + content + b"\0" * (-len(content) % 4)
libs = [l.strip() for l in open(os.path.join(work, "libs")) if l.strip()]
modules = [l.strip() for l in open(os.path.join(work, "modules")) if l.strip()]
dirs = {"proc", "sys", "dev", "tmp", "lib", "lib/modules"}
for lib in libs:
    parts = lib.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        dirs.add("/".join(parts[:i]))
with open(out, "wb") as f:
    for d in sorted(dirs):
        f.write(entry(d, 0o040755))
    for name in ("init", "virtprof"):
        f.write(entry(name, 0o100755, open(os.path.join(work, name), "rb").read()))
    for lib in libs:
        f.write(entry(lib.lstrip("/"), 0o100755, open(os.path.realpath(lib), "rb").read()))
    names = [os.path.basename(m)[:-3] for m in modules]
    for m, name in zip(modules, names):
        f.write(entry("lib/modules/" + name + ".ko", 0o100644, open(m, "rb").read()))
    f.write(entry("lib/modules/order", 0o100644, "".join(n + "\n" for n in names).encode()))
    for pair in files.split():
        src, dest = pair.split(":", 1)
        # Programs stay runnable (a loader, busybox); other files are private to the guest.
        mode = 0o100700 if os.access(src, os.X_OK) else 0o100600
        f.write(entry(dest.lstrip("/"), mode, open(src, "rb").read()))
    f.write(entry("TRAILER!!!", 0))
PY
echo "guest-initrd.sh: $out ($(du -h "$out" | cut -f1), $(wc -l < "$work/libs") libraries)" >&2
