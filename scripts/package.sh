#!/usr/bin/env bash
# Build what virtprof installs from, into target/package/:
#   virtprof                       one static x86_64 binary (no dynamic dependencies): copy it to
#                                  a host, or into a guest for `virtprof agent`
#   virtprof_VERSION_amd64.deb     the binary, man pages, bash/zsh/fish completions, the
#                                  virtprof-serve systemd unit and the example Prometheus,
#                                  Grafana and Kubernetes files
#   SHA256SUMS
#
#   scripts/package.sh             (a release build: about 5 minutes on 2 cores from scratch)
#
# Needs cargo, glibc's static libraries (libc6-dev), dpkg-deb, gzip and objcopy.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "package.sh: $*" >&2; exit 2; }
target=x86_64-unknown-linux-gnu
out=target/package
for tool in dpkg-deb gzip objcopy readelf; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install dpkg-dev gzip binutils)"
done

# crt-static on the gnu target: glibc linked in, a static-pie binary. Only the target's
# artifacts get the flag (--target keeps it off build scripts and proc macros).
echo "package.sh: cargo build --release (static, $target)"
# No DWARF is built (it would be stripped below anyway): a minute less on 2 cores.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" CARGO_PROFILE_RELEASE_DEBUG=0 \
    cargo build --release --locked --target "$target" -p virtprof-cli
built=target/$target/release/virtprof
if readelf -d "$built" | grep -q '(NEEDED)'; then
    die "$built links dynamic libraries: $(readelf -d "$built" | grep '(NEEDED)' | tr -s ' ' | tr '\n' ' ')"
fi
rm -rf "$out"
mkdir -p "$out"
# Symbols kept (profilers and backtraces name functions), DWARF dropped.
objcopy --strip-debug "$built" "$out/virtprof"
bin=$out/virtprof
version=$("$bin" --version | awk '{ print $2 }')
[ -n "$version" ] || die "$bin --version printed no version"

# The package's tree.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -D -m 755 "$bin" "$root/usr/bin/virtprof"
"$bin" manpages "$root/usr/share/man/man1" >/dev/null
gzip -9n "$root"/usr/share/man/man1/*.1
"$bin" completions bash | install -D -m 644 /dev/stdin "$root/usr/share/bash-completion/completions/virtprof"
"$bin" completions zsh | install -D -m 644 /dev/stdin "$root/usr/share/zsh/vendor-completions/_virtprof"
"$bin" completions fish | install -D -m 644 /dev/stdin "$root/usr/share/fish/vendor_completions.d/virtprof.fish"
install -D -m 644 packaging/virtprof-serve.service "$root/lib/systemd/system/virtprof-serve.service"
install -D -m 644 packaging/virtprof-serve.default "$root/etc/default/virtprof-serve"
doc=$root/usr/share/doc/virtprof
install -D -m 644 packaging/debian/copyright "$doc/copyright"
install -D -m 644 README.md "$doc/README.md"
install -D -m 644 docs/fleet.md "$doc/fleet.md"
install -D -m 644 deploy/prometheus/prometheus.yml "$doc/examples/prometheus/prometheus.yml"
install -D -m 644 deploy/prometheus/alerts.yml "$doc/examples/prometheus/alerts.yml"
install -D -m 644 deploy/grafana/virtprof.json "$doc/examples/grafana/virtprof.json"
for manifest in deploy/kubernetes/*.yaml; do
    install -D -m 644 "$manifest" "$doc/examples/kubernetes/$(basename "$manifest")"
done

mkdir -p "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/amd64/" -e "s/@SIZE@/$size/" \
    packaging/debian/control.in > "$root/DEBIAN/control"
echo /etc/default/virtprof-serve > "$root/DEBIAN/conffiles"
install -m 755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$root/DEBIAN/"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
deb=$out/virtprof_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
(cd "$out" && sha256sum virtprof "$(basename "$deb")" > SHA256SUMS)
echo "package.sh: $bin ($(du -h "$bin" | cut -f1), static), $deb ($(du -h "$deb" | cut -f1))"
