#!/usr/bin/env bash
# Record with the real trace-cmd (trixie's, from fetch.sh) on this host, for fixtures made by
# the peer's own tool: `record.sh DIR OUT.dat [trace-cmd record options] -- COMMAND...`.
# Where the kernel has no function tracer, trace-cmd's writes to the function-tracer files
# fail and end the recording; no-ftrace-files.c, preloaded, sends those to /dev/null. The
# instances trace-cmd makes for -B are removed afterwards even if it dies.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(realpath "${1:?usage: record.sh DIR OUT.dat [options] -- COMMAND...}")
out=${2:?usage: record.sh DIR OUT.dat [options] -- COMMAND...}
shift 2
root="$dir/root"
libs="$root/usr/lib/x86_64-linux-gnu"
[ -x "$root/usr/bin/trace-cmd" ] || { echo "record.sh: no trace-cmd in $dir (run fetch.sh $dir)" >&2; exit 1; }
shim="$dir/no-ftrace-files.so"
if [ ! -s "$shim" ] || [ "$here/no-ftrace-files.c" -nt "$shim" ]; then
    gcc -shared -fPIC -O2 -o "$shim" "$here/no-ftrace-files.c" -ldl
fi
options=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
instances=()
for ((i = 0; i < ${#options[@]}; i++)); do
    [ "${options[$i]}" = -B ] && instances+=("${options[$((i + 1))]}")
done
cleanup() {
    for name in "${instances[@]}"; do
        [ -d "/sys/kernel/tracing/instances/$name" ] && rmdir "/sys/kernel/tracing/instances/$name" 2>/dev/null || true
    done
}
trap cleanup EXIT
"$libs/ld-linux-x86-64.so.2" --preload "$shim" --library-path "$libs" "$root/usr/bin/trace-cmd" \
    record -q "${options[@]}" -o "$out" "$@"
