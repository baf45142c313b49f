#!/usr/bin/env bash
# Install what the tests need, prepare the host, and run every check CI runs:
# cargo fmt --check, clippy with -D warnings, and the whole test suite.
# Tests that need /dev/kvm, tracefs or root skip (saying why) only where those are absent.
set -euo pipefail
shopt -s lastpipe
cd "$(dirname "$0")/.."
# Each step says when it started (minutes into the run): CI must stay under 45 minutes, and
# this is where its time goes.
step() { printf 'test.sh: [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

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
    # arm64 (issue 37): the cross toolchain, QEMU user mode for the arch-free tests, and QEMU's
    # arm64 system emulator for the arm64 KVM bed (scripts/arm64/bed.sh), whose Debian kernel
    # comes from the arm64 package lists.
    command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
    command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
    command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
    # The bed's L2 Linux guest gets its device tree from dtc.
    command -v dtc >/dev/null || need+=(device-tree-compiler)
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        echo "test.sh: adding the arm64 package architecture (for the arm64 bed's kernel)"
        dpkg --add-architecture arm64
        apt-get update -qq
    fi
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
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# arm64: the workspace builds for aarch64 with no warnings, its arch-free crates' tests pass
# under QEMU user mode, and the aarch64 binary goes to the arm64 bed's tests (VIRTPROF_AARCH64).
if rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 && command -v aarch64-linux-gnu-gcc >/dev/null; then
    step "aarch64: clippy"
    cargo clippy --target aarch64-unknown-linux-gnu --workspace --all-targets --locked -- -D warnings
    # Emulated, the fuzz targets run a tenth of their inputs (the x86 run does them all).
    step "aarch64: tests under qemu-user"
    VIRTPROF_FUZZ_ITERS=5000 cargo test --target aarch64-unknown-linux-gnu --locked -p virtprof-model \
        -p virtprof-trace -p virtprof-analysis -p virtprof-store -p virtprof-sinks
    # No debug info and opt-level 1: the arm64 bed needs the program, not its DWARF or its
    # last few percent of speed (4m40s to build at opt-level 3 on 2 cores, 3m30s at 1).
    step "aarch64: release build"
    CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
        cargo build --release --target aarch64-unknown-linux-gnu --locked -p virtprof-cli
    export VIRTPROF_AARCH64=$PWD/target/aarch64-unknown-linux-gnu/release/virtprof
else
    echo "test.sh: no aarch64 toolchain (rustup target or gcc-aarch64-linux-gnu): the arm64 build and bed are skipped"
fi
# The static binary and the Debian package: the packaging tests install them, and the agent
# tests put the static binary alone in their guests (VIRTPROF_PACKAGE_DIR).
step "scripts/package.sh"
scripts/package.sh
export VIRTPROF_PACKAGE_DIR=$PWD/target/package
# kubeconform and the schemas (Go modules, PyPI) fetched before the tests, not during them: the
# Kubernetes manifests' test then only validates.
bash scripts/kubernetes/check.sh || echo "test.sh: scripts/kubernetes/check.sh failed; its test will say why"
step "cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
notes=target/tmp/host-notes.txt
lock_times=target/tmp/vm-lock-times.txt
rm -f "$notes" "$lock_times"
# Every test binary runs even after one fails: one red test must not hide the others.
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
# What passing tests found this host lacks (skips, operations that make no exit): said, not hidden.
if [ -s "$notes" ]; then
    echo "test.sh: notes on this host from the tests:"
    sed 's/^/  /' "$notes"
fi
# The tests that run VMs run one after another (they hold one lock): where that serial time went.
if [ -s "$lock_times" ]; then
    echo "test.sh: VM-lock time, $(awk '{ s += $1 } END { printf "%.0f s", s }' "$lock_times") in all; the longest:"
    sort -rn "$lock_times" | sed -n '1,8s/^/  /p'
fi
# One closing line for the whole suite (cargo prints one per test binary, the last often a
# doc-test binary with 0 tests).
awk '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
step "done"
