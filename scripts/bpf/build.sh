#!/usr/bin/env bash
# Build the eBPF objects in crates/engine/bpf from their C sources with Debian's clang 14
# (apt-get install clang-14 libbpf-dev): `scripts/bpf/build.sh` rewrites the committed
# objects; `scripts/bpf/build.sh --check` rebuilds into a temporary folder and fails if any
# differs from the committed one (the build is reproducible: no paths or dates in the object).
set -euo pipefail
cd "$(dirname "$0")/../.."
CLANG=${CLANG:-clang-14}
command -v "$CLANG" >/dev/null || { echo "build.sh: $CLANG not found (apt-get install clang-14 libbpf-dev)" >&2; exit 2; }
[ -f /usr/include/bpf/bpf_helpers.h ] || { echo "build.sh: bpf/bpf_helpers.h not found (apt-get install libbpf-dev)" >&2; exit 2; }
out=$PWD/crates/engine/bpf
[ "${1:-}" = --check ] && out=$(mktemp -d) && trap 'rm -rf "$out"' EXIT
for src in crates/engine/bpf/*.bpf.c; do
    obj=$out/$(basename "${src%.c}").o
    # -g: BTF, which the loader needs for the maps; -fdebug-prefix-map: no build path in it.
    (cd crates/engine/bpf && "$CLANG" -O2 -g -target bpf -fdebug-prefix-map="$PWD"=. \
        -I/usr/include/x86_64-linux-gnu -c "$(basename "$src")" -o "$obj.tmp")
    mv "$obj.tmp" "$obj"
    # Debug sections beyond BTF are not needed at run time.
    llvm-strip-14 --strip-debug "$obj" 2>/dev/null || llvm-strip --strip-debug "$obj"
    if [ "${1:-}" = --check ]; then
        cmp -s "$obj" "crates/engine/bpf/$(basename "$obj")" || { echo "build.sh: $(basename "$obj") differs from the one in crates/engine/bpf: rebuild with scripts/bpf/build.sh" >&2; exit 1; }
    fi
done
echo "build.sh: $(ls crates/engine/bpf/*.bpf.c | wc -l) object(s) $([ "${1:-}" = --check ] && echo "rebuilt, identical" || echo built)"
