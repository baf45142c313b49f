#!/usr/bin/env bash
# Fetch Debian's current linux-image-amd64 kernel and its real System.map (Debian ships a
# placeholder System.map in the image package; the real one is in the -dbg package, of which
# only that file is unpacked), and build a one-file initramfs whose init prints
# VIRTPROF-INIT-MARKER and powers off. Output: DIR/{vmlinuz,System.map,initrd.cpio,version}.
# Used by the `virtprof boot --qemu` tests; reuses DIR when it is complete.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:?usage: fetch.sh DIR}")
if [ -s "$out/vmlinuz" ] && [ -s "$out/System.map" ] && [ -s "$out/initrd.cpio" ]; then
    exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
[ -n "$pkg" ] || { echo "fetch.sh: apt knows no linux-image-amd64 (run apt-get update)" >&2; exit 1; }
echo "fetch.sh: downloading $pkg and $pkg-dbg (about 930 MB)" >&2
apt-get download -qq "$pkg" "$pkg-dbg" 2>/dev/null
version=${pkg#linux-image-}
dpkg-deb --fsys-tarfile "${pkg}"_*.deb | tar -x -O "./boot/vmlinuz-$version" > "$out/vmlinuz"
# The System.map comes early in the -dbg archive: stop reading once it is out.
python3 - "$pkg" "$version" "$out/System.map" <<'PY'
import glob, subprocess, sys, tarfile
pkg, version, dest = sys.argv[1:4]
deb = glob.glob(pkg + "-dbg_*.deb")[0]
proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
    for member in tar:
        if member.name.endswith("/boot/System.map-" + version):
            open(dest, "wb").write(tar.extractfile(member).read())
            break
proc.kill()
PY
gcc -Os -static -nostdlib -fno-pie -no-pie -o init "$here/init.c"
# newc cpio with the single file /init (the kernel's built-in initramfs supplies /dev/console).
python3 - init "$out/initrd.cpio" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
def entry(name, mode, content, ino):
    fields = [ino, mode, 0, 0, 1, 0, len(content), 0, 0, 0, 0, len(name) + 1, 0]
    b = b"070701" + "".join("%08X" % v for v in fields).encode() + name.encode() + b"\0"
    b += b"\0" * (-len(b) % 4)
    return b + content + b"\0" * (-len(content) % 4)
open(sys.argv[2], "wb").write(entry("init", 0o100755, data, 1) + entry("TRAILER!!!", 0, b"", 0))
PY
echo "$version" > "$out/version"
echo "fetch.sh: $out ready (kernel $version)" >&2
