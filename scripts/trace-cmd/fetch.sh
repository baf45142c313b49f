#!/usr/bin/env bash
# A second trace-cmd, newer than bookworm's and built with zlib (bookworm's 3.1 has zstd only):
# Debian trixie's trace-cmd 3.3 with its own libraries and C library, unpacked into DIR and run
# through that C library's loader, so the host's packages are untouched. DIR/trace-cmd is a
# wrapper that runs it. The fixture tests use it to write zlib and version 6 trace.dat files
# (`trace-cmd convert`) and to read them back (`trace-cmd report`). Reuses DIR when complete.
set -euo pipefail
out=$(realpath -m "${1:?usage: fetch.sh DIR}")
if [ -x "$out/trace-cmd" ] && "$out/trace-cmd" list -c 2>/dev/null | grep -q zlib; then
    exit 0
fi
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages="trace-cmd libtracecmd1 libtracefs1 libtraceevent1 libtraceevent1-plugin libzstd1 zlib1g libc6 libaudit1 libcap-ng0"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetch.sh: reading trixie's package index" >&2
curl -fsS "$mirror/dists/trixie/main/binary-amd64/Packages.xz" | xz -dc > "$work/Packages"
rm -rf "$out.new" && mkdir -p "$out.new/root"
for package in $packages; do
    file=$(awk -v p="$package" '$1=="Package:"{hit=($2==p)} hit&&$1=="Filename:"{print $2; exit}' "$work/Packages")
    [ -n "$file" ] || { echo "fetch.sh: trixie has no package $package" >&2; exit 1; }
    curl -fsS "$mirror/$file" -o "$work/$package.deb"
    dpkg-deb -x "$work/$package.deb" "$out.new/root"
done
root="$out.new/root"
libs="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu"
cat > "$out.new/trace-cmd" <<WRAP
#!/bin/sh
# trixie's trace-cmd through its own loader and libraries (scripts/trace-cmd/fetch.sh).
here=\$(cd "\$(dirname "\$0")" && pwd)
export TRACEEVENT_PLUGIN_DIR="\$here/root/usr/lib/x86_64-linux-gnu/traceevent/plugins"
exec "\$here/root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "\$here/root/usr/lib/x86_64-linux-gnu:\$here/root/lib/x86_64-linux-gnu" "\$here/root/usr/bin/trace-cmd" "\$@"
WRAP
chmod +x "$out.new/trace-cmd"
rm -rf "$out" && mv "$out.new" "$out"
"$out/trace-cmd" list -c | grep -q zlib || { echo "fetch.sh: the unpacked trace-cmd has no zlib" >&2; exit 1; }
echo "fetch.sh: $out/trace-cmd ready ($("$out/trace-cmd" --version 2>&1 | grep -o 'version [0-9.]*'))" >&2
