#!/bin/sh
# The boot-profiling study's balloon (seed 003, Table 2) for the nested-SVM bed's L2 kernel:
# Debian's headers and kbuild for that kernel (fetched with apt-get download, unpacked here,
# nothing installed), vp_balloon.ko built against them, and an initramfs for L2: the bed's own
# (bed.sh prepare makes it) with the module and balloon-init appended (boot L2 with
# rdinit=/balloon-init balloon_ms=MS). The kernel's symbols: scripts/debian-kernel/fetch.sh.
#
#   sh scripts/boot-balloon/build.sh [OUT]     (default target/boot-balloon)
#
# Prints OUT. Needs gcc (the kernel's: Debian bookworm's gcc-12), make, apt with Debian's
# bookworm archive (the kernel's), dpkg-deb.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "${1:-$root/target/boot-balloon}")
cache=${BED_CACHE:-$root/target/nested-svm}
die() { echo "boot-balloon: $*" >&2; exit 2; }
for tool in gcc make dpkg-deb apt-get; do
    command -v "$tool" > /dev/null || die "needs $tool"
done
bash "$root/scripts/nested-svm/bed.sh" prepare > /dev/null
deb=$(ls "$cache"/linux-image-*.deb | head -1)
# linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb: the kernel 6.1.0-56-amd64, package 6.1.192-2.
release=$(basename "$deb" | sed 's/^linux-image-\([^_]*\)_.*/\1/')
version=$(basename "$deb" | sed 's/^[^_]*_\([^_]*\)_.*/\1/')
flavour=${release##*-}
common=${release%-"$flavour"}
mkdir -p "$out/debs" "$out/sysroot"
if [ ! -s "$out/vp_balloon.ko" ] || [ ! -s "$out/balloon-initrd.gz" ] || [ "$here/vp_balloon.c" -nt "$out/vp_balloon.ko" ] ||
    [ "$here/balloon-init" -nt "$out/balloon-initrd.gz" ]; then
    if [ ! -d "$out/sysroot/usr/src/linux-headers-$release" ]; then
        kbuild=linux-kbuild-$(echo "$version" | cut -d. -f1-2)
        echo "boot-balloon: fetching the headers of $release ($version)" >&2
        (cd "$out/debs" && apt-get download -qq -o APT::Sandbox::User=root "linux-headers-$release=$version" \
            "linux-headers-$common-common=$version" "$kbuild=$version") ||
            die "apt-get download of the headers of $release failed (apt-get update; the kernel's archive must be in sources.list)"
        for d in "$out"/debs/*.deb; do dpkg-deb -x "$d" "$out/sysroot"; done
        # The flavour's Makefile includes the common one by its installed path.
        sed -i "s|/usr/src/|$out/sysroot/usr/src/|" "$out/sysroot/usr/src/linux-headers-$release/Makefile"
    fi
    rm -rf "$out/build" && mkdir -p "$out/build"
    cp "$here/vp_balloon.c" "$here/Kbuild" "$out/build/"
    make -s -C "$out/sysroot/usr/src/linux-headers-$release" M="$out/build" modules > "$out/build.log" 2>&1 ||
        { cat "$out/build.log" >&2; die "building vp_balloon.ko failed"; }
    cp "$out/build/vp_balloon.ko" "$out/vp_balloon.ko"
    extra=$out/extra
    rm -rf "$extra" && mkdir -p "$extra"
    cp "$out/vp_balloon.ko" "$extra/" && cp "$here/balloon-init" "$extra/" && chmod +x "$extra/balloon-init"
    # A second archive after the bed's: the kernel unpacks both into one root.
    { cat "$cache/l2-initrd.gz"; python3 "$root/scripts/newc.py" "$extra" | gzip -1; } > "$out/balloon-initrd.gz"
    rm -rf "$extra"
fi
echo "$out"
