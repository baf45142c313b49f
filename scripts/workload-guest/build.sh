#!/usr/bin/env bash
# The workload guest: a Linux guest holding real programs, built from Debian packages
# (`apt-get download`, unpacked; nothing is fetched at run time). Everything goes to DIR
# (default target/workload-guest), reused while complete:
#
#   DIR/root/          the unpacked programs: lighttpd, iperf3, stress-ng, sqlite3, zstd, xz,
#                      tcc (with libc6-dev), busybox, wrk (the load generator, run on the host
#                      side with `chroot DIR/root`), virtprof (for `virtprof agent`)
#   DIR/initrd.gz      root as the guest's initramfs, with the kernel modules for virtio-net,
#                      virtio-blk, virtio-serial, vsock, ext4 and ptp_kvm, and /init (init in
#                      this folder)
#   DIR/data/          the workloads' data: a web root, C sources, a text to compress
#   DIR/disk.img       data as an ext4 image (the guest's virtio-blk disk; run.sh uses a copy)
#   DIR/vmlinuz        the kernel it boots (the nested-SVM bed's Debian kernel)
#
#   bash scripts/workload-guest/build.sh [DIR]
#
# VIRTPROF: the binary put in the guest (default target/debug/virtprof). Needs apt (run
# apt-get update once), dpkg-deb, mkfs.ext4, gzip, python3 and about 200 MB.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "${1:-$root/target/workload-guest}")
virtprof=$(realpath "${VIRTPROF:-$root/target/debug/virtprof}")
die() { echo "build.sh: $*" >&2; exit 2; }

# The programs and the libraries they load. Listed rather than resolved by apt: the full
# dependency closure (143 packages) drags in perl, systemd and PAM, which no program here
# runs; every program is run once below, so a library Debian adds later is found missing at
# build time, not in the guest.
packages=(
    lighttpd libcrypt1 libnettle8 libpcre2-8-0 libxxhash0
    iperf3 libiperf0 libsctp1 libssl3
    stress-ng libapparmor1 libbsd0 libmd0 libcap-ng0 libegl1 libglvnd0 libegl-mesa0 libgbm1
    libdrm2 libdrm-common libexpat1 libffi8 libglapi-mesa libwayland-client0 libwayland-server0
    libx11-6 libx11-data libx11-xcb1 libxau6 libxcb1 libxcb-dri2-0 libxcb-dri3-0 libxcb-present0
    libxcb-randr0 libxcb-sync1 libxcb-xfixes0 libxdmcp6 libxshmfence1 libgles2 libipsec-mb1
    libjpeg62-turbo libjudydebian1 libkmod2 liblzma5 libzstd1 liblz4-1 zlib1g libbz2-1.0
    libgcc-s1 libstdc++6 gcc-12-base
    sqlite3 libsqlite3-0 libreadline8 libtinfo6
    zstd xz-utils
    tcc libc6-dev libc6 linux-libc-dev libcrypt-dev libnsl-dev libtirpc-dev rpcsvc-proto
    busybox-static
    wrk libluajit-5.1-2 libluajit-5.1-common
)
# The programs whose libraries are checked at build time.
programs=(usr/sbin/lighttpd usr/bin/iperf3 usr/bin/stress-ng usr/bin/sqlite3 usr/bin/zstd usr/bin/xz usr/bin/tcc
    usr/bin/wrk usr/bin/virtprof)

complete() {
    [ -s "$out/initrd.gz" ] && [ -s "$out/disk.img" ] && [ -s "$out/vmlinuz" ] && [ -d "$out/data" ] &&
        [ "$out/initrd.gz" -nt "$virtprof" ] && [ "$out/initrd.gz" -nt "$here/init" ] &&
        [ "$out/initrd.gz" -nt "$here/workloads.sh" ] && [ "$out/initrd.gz" -nt "$0" ]
}

[ -x "$virtprof" ] || die "no virtprof binary at $virtprof (cargo build, or set VIRTPROF)"
for tool in apt-get dpkg-deb mkfs.ext4 gzip python3; do
    command -v "$tool" >/dev/null || die "needs $tool"
done
mkdir -p "$out"
exec 9> "$out/.lock"
flock 9
complete && { echo "$out"; exit 0; }

# 1. The packages, downloaded once into DIR/debs.
mkdir -p "$out/debs"
missing=()
for p in "${packages[@]}"; do
    ls "$out/debs/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build.sh: downloading ${#missing[@]} Debian packages" >&2
    # (apt says it downloads "unsandboxed as root" where _apt cannot write here: harmless.)
    (cd "$out/debs" && apt-get download -qq "${missing[@]}" 2> >(grep -v unsandboxed >&2)) ||
        die "apt-get download failed (run apt-get update; offline hosts need DIR/debs filled in)"
fi

# 2. Unpacked into one root, busybox's tools beside the programs.
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
r=$work/root
mkdir -p "$r"
for p in "${packages[@]}"; do
    dpkg-deb -x "$(ls "$out/debs/${p}_"*.deb | tail -1)" "$r"
done
# Documentation, GPU drivers and the static C libraries (tcc links against the shared ones,
# with its own libtcc1.a) are not needed: 10 MB less for every boot to unpack.
rm -rf "$r"/usr/share/{doc,man,info,locale,lintian,bug} "$r"/usr/lib/x86_64-linux-gnu/dri
find "$r/usr/lib/x86_64-linux-gnu" -name '*.a' ! -name 'libc_nonshared.a' ! -path '*/tcc/*' -delete
mkdir -p "$r"/{proc,sys,dev,tmp,run,data,sbin,bed,lib/modules,var/tmp,var/log}
for applet in $("$r/bin/busybox" --list-full); do
    [ -e "$r/$applet" ] || [ -L "$r/$applet" ] || ln -s /bin/busybox "$r/$applet"
done
objcopy --strip-all "$virtprof" "$r/usr/bin/virtprof"
cp "$here/init" "$r/init" && chmod +x "$r/init"
cp "$here/workloads.sh" "$r/bed/workloads.sh"
cat > "$r/bed/lighttpd.conf" <<'EOF'
server.document-root = "/data/www"
server.port = 8080
server.bind = "0.0.0.0"
server.upload-dirs = ("/var/tmp")
index-file.names = ("index.html")
mimetype.assign = (".html" => "text/html", ".bin" => "application/octet-stream")
EOF
for program in "${programs[@]}"; do
    libs=$(chroot "$r" /lib64/ld-linux-x86-64.so.2 --list "/$program" 2>&1) || die "/$program: $libs"
    if grep -q "not found" <<< "$libs"; then
        die "/$program needs libraries no listed package has (add their packages): $(grep "not found" <<< "$libs")"
    fi
done

# 3. The kernel and its modules: the nested-SVM bed's Debian kernel package.
kernel=$(bash "$root/scripts/nested-svm/bed.sh" kernel)
bash "$root/scripts/nested-svm/bed.sh" modules "$kernel/kernel/lib/modules" virtio_pci virtio_net virtio_blk \
    virtio_console vmw_vsock_virtio_transport ext4 crc32c_generic ptp_kvm | while read -r ko; do
    cp "$ko" "$r/lib/modules/"
    basename "$ko" .ko >> "$r/lib/modules/order"
done
cp "$kernel/vmlinuz" "$work/vmlinuz"

# 4. The data: a web root, a small C project, a text to compress (deterministic).
python3 - "$work/data" <<'PY'
import os, random, sys
data = sys.argv[1]
rng = random.Random(34)
os.makedirs(data + "/www")
open(data + "/www/index.html", "w").write("<html><body><h1>virtprof workload guest</h1></body></html>\n")
open(data + "/www/64k.bin", "wb").write(bytes(rng.getrandbits(8) for _ in range(64 << 10)))
os.makedirs(data + "/src")
for f in range(8):
    with open(f"{data}/src/unit{f}.c", "w") as c:
        c.write("#include <stdio.h>\n#include <string.h>\n#include <stdlib.h>\n\n")
        for i in range(150):
            c.write(f"int unit{f}_fn{i}(const char *s, int n) {{\n"
                    f"    int h = {rng.randrange(1, 1 << 20)};\n"
                    f"    for (int i = 0; i < n && s[i]; i++) h = h * 31 + s[i] * {i % 7 + 1};\n"
                    f"    if (h % 3 == 0) h ^= (int)strlen(s);\n    return h;\n}}\n\n")
words = [("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 10))))
         for _ in range(4000)]
with open(data + "/input.txt", "w") as t:
    size = 0
    while size < 2 << 20:
        line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
        t.write(line)
        size += len(line)
PY
truncate -s 64M "$work/disk.img"
mkfs.ext4 -q -F -L data -d "$work/data" "$work/disk.img"

# 5. The initramfs, then everything moved into place at once.
python3 "$root/scripts/newc.py" "$r" | gzip -1 > "$work/initrd.gz"
rm -rf "$out/root" "$out/data"
mv "$r" "$out/root" && mv "$work/data" "$out/data"
mv "$work/vmlinuz" "$work/disk.img" "$out/"
mv "$work/initrd.gz" "$out/initrd.gz"
echo "build.sh: $out/initrd.gz ($(du -h "$out/initrd.gz" | cut -f1)), root $(du -sh "$out/root" | cut -f1)" >&2
echo "$out"
