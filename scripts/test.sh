#!/usr/bin/env bash
# Install what the tests need, prepare the host, and run every check CI runs:
# cargo fmt --check, clippy with -D warnings, and the whole test suite.
# Tests that need /dev/kvm, tracefs or root skip (saying why) only where those are absent.
set -euo pipefail
shopt -s lastpipe
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
    need=()
    # perf: the tests compare our counts with `perf stat -e kvm:*`; unshare hides /dev/kvm.
    dpkg -s linux-perf >/dev/null 2>&1 || need+=(linux-perf)
    command -v unshare >/dev/null || need+=(util-linux)
    # trace-cmd: converts the trace.dat fixture to an uncompressed one (read in place).
    command -v trace-cmd >/dev/null || need+=(trace-cmd)
    # tmux: drives `virtprof demo` in a real terminal.
    command -v tmux >/dev/null || need+=(tmux)
    # chromium: renders `report --html` headless (no console errors, every chart drawn).
    command -v chromium >/dev/null || need+=(chromium)
    # qemu + gcc: `boot --qemu` profiles a real Debian kernel booting under TCG.
    command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
    command -v gcc >/dev/null || need+=(gcc)
    # busybox-static: the nested-SVM bed's L1 userland (scripts/nested-svm/bed.sh).
    dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
    # prometheus (with promtool), curl, openssl: a real Prometheus scrapes `virtprof serve`
    # over HTTP and HTTPS (a self-signed certificate).
    command -v prometheus >/dev/null || need+=(prometheus)
    command -v curl >/dev/null || need+=(curl)
    # clang 14, libbpf's headers, llvm-strip: the eBPF objects are rebuilt and compared with
    # the committed ones (scripts/bpf/build.sh --check).
    command -v clang-14 >/dev/null || need+=(clang-14)
    command -v llvm-strip-14 >/dev/null || need+=(llvm-14)
    [ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
    command -v openssl >/dev/null || need+=(openssl)
    if [ ${#need[@]} -gt 0 ]; then
        echo "test.sh: installing ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    # Debian's kernel, its real System.map and a marker initramfs, for the `boot --qemu` tests.
    bash scripts/debian-kernel/fetch.sh target/debian-kernel || echo "test.sh: could not fetch the Debian kernel; boot --qemu tests will skip"
    # A zlib-capable trace-cmd (trixie's 3.3, unpacked beside the host's): the trace.dat tests
    # write and read v6, zlib and multi-buffer files with it, and record with it.
    bash scripts/trace-cmd/fetch.sh target/trace-cmd-trixie || echo "test.sh: could not fetch trixie's trace-cmd; the trace.dat variant tests will skip"
    if ! grep -q ' tracefs ' /proc/mounts; then
        mount -t tracefs nodev /sys/kernel/tracing || echo "test.sh: could not mount tracefs; tracefs tests will skip"
    fi
    # Instances left by virtprof processes of earlier runs (killed ones): the tests check that
    # this run leaves none, so start from none (`virtprof doctor --cleanup` does the same).
    for dir in /sys/kernel/tracing/instances/virtprof-*; do
        [ -d "$dir" ] || continue
        pid=${dir##*-}
        if [ ! -d "/proc/$pid" ]; then
            echo "test.sh: removing stale tracefs instance $dir"
            rmdir "$dir" || true
        fi
    done
else
    echo "test.sh: not root: apt installs and tracefs/pidfd tests are skipped"
fi

# pyarrow: reads our Parquet exports back independently of the Rust code that wrote them.
if ! python3 -c 'import pyarrow.parquet' 2>/dev/null; then
    echo "test.sh: pip install pyarrow"
    python3 -m pip install -q pyarrow || echo "test.sh: could not install pyarrow; the Parquet test will skip"
fi
# duckdb and pyspark (local mode, on the machine's Java): read a fleet dataset of Parquet
# exports as their users would (export --dataset).
for module in duckdb pyspark; do
    if ! python3 -c "import $module" 2>/dev/null; then
        echo "test.sh: pip install $module"
        python3 -m pip install -q "$module" || echo "test.sh: could not install $module; the dataset test will skip it"
    fi
done

rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "test.sh: cargo fmt --check"
cargo fmt --all -- --check
echo "test.sh: cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "test.sh: cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
notes=target/tmp/host-notes.txt
rm -f "$notes"
cargo test --workspace --locked 2>&1 | tee "$log"
# What passing tests found this host lacks (skips, operations that make no exit): said, not hidden.
if [ -s "$notes" ]; then
    echo "test.sh: notes on this host from the tests:"
    sed 's/^/  /' "$notes"
fi
# One closing line for the whole suite (cargo prints one per test binary, the last often a
# doc-test binary with 0 tests).
awk '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
