# What the study scripts share (sourced by benches/papers/*.sh, POSIX sh): the binary they
# use, the virtualization they run on, the expected duration said before they start, the
# manifest that makes a results folder self-describing, and the load guard around each run.
# Callers set $here (this folder), $root (the repository) and $out (the study's folder).

# The release binary (timings of a debug build are not virtprof's): VIRTPROF if set, else
# target/release/virtprof, built (or brought up to date) first.
study_binary() {
    if [ -n "${VIRTPROF:-}" ]; then
        virtprof=$VIRTPROF
    else
        virtprof=$root/target/release/virtprof
        echo "$study: cargo build --release -p virtprof-cli" >&2
        (cd "$root" && cargo build --release --locked -q -p virtprof-cli) >&2 ||
            { echo "$study: the release build failed" >&2; exit 2; }
    fi
    [ -x "$virtprof" ] || { echo "$study: no virtprof binary at $virtprof (cargo build --release, or set VIRTPROF)" >&2; exit 2; }
    export VIRTPROF=$virtprof
}

# How the workload guest runs on this host (as its run.sh decides): accel=kvm where the CPU has
# VMX or SVM and /dev/kvm can be opened, else tcg; accel_why says which, for the manifest and
# the first line.
study_accel() {
    accel=tcg accel_why="no VMX or SVM here: the guest runs under QEMU TCG (emulated; timings are emulation's)"
    if [ -w /dev/kvm ]; then
        if grep -qw vmx /proc/cpuinfo; then
            accel=kvm accel_why="Intel VMX: the guest runs under KVM"
        elif grep -qw svm /proc/cpuinfo; then
            accel=kvm accel_why="AMD SVM: the guest runs under KVM"
        fi
    fi
}

# Say what the study will do and about how long it takes: study_plan RUNS SECONDS [BOOT], a run
# being SECONDS of workload after BOOT seconds of start-up (default: the workload guest's boot
# and shutdown, 13-19 s measured under TCG on 2 CPUs, a few under KVM).
study_plan() {
    study_boot=${3:-16}
    [ -n "${3:-}" ] || [ "$accel" != kvm ] || study_boot=5
    study_each=$(($2 + study_boot))
    echo "$study: $1 runs of about $study_each s each: expect about $(( ($1 * study_each + 59) / 60 )) minutes ($accel_why)" >&2
}

# How many runs: study_count RUNS WORDS... is RUNS for every combination of the words' items
# (each word a space-separated list), e.g. study_count 5 "$ratios" "$steps".
study_count() {
    study_total=$1
    shift
    for study_list in "$@"; do
        set -- $study_list
        study_total=$((study_total * $#))
    done
    echo "$study_total"
}

# The study's pinned inputs, built (or checked) before the manifest records them: the
# workload guest (its packages and the Debian kernel), with "bed" the nested-SVM bed's kernel
# alone, with "arm64" the arm64 bed's kernel and busybox.
study_inputs() {
    if [ "${1:-}" = bed ]; then
        STUDY_INPUTS=kernel
        bash "$root/scripts/nested-svm/bed.sh" kernel > /dev/null
    elif [ "${1:-}" = arm64 ]; then
        STUDY_INPUTS=arm64
        VIRTPROF=${VIRTPROF_AARCH64:-$VIRTPROF} bash "$root/scripts/arm64/bed.sh" prepare > /dev/null
    else
        STUDY_INPUTS="kernel guest"
        bash "$root/scripts/workload-guest/build.sh" > /dev/null
    fi
    export STUDY_INPUTS
}

# The results folder's manifest: the command, versions and host facts a reader needs to trust
# or redo the numbers. study_manifest KEY=VALUE... adds the study's own parameters.
study_manifest() {
    python3 "$here/manifest.py" "$out/manifest.json" "${study%.sh}" "$virtprof" "$accel" "$accel_why" "$@"
}

# One run under the load guard: study_run NAME LOG RESULT COMMAND [ARGS...]. The command's
# stdout goes to RESULT, its stderr to LOG; guard.py's verdict to $out/NAME.guard.json and to
# the terminal. A disturbed run is done again up to GUARD_RETRIES times (default 2); the
# verdicts of the disturbed attempts are kept as NAME.disturbed-K.guard.json. Returns the
# command's exit code.
study_run() {
    # Globals (POSIX sh has no locals), prefixed so the callers' own names are safe.
    study_name=$1 study_log=$2 study_result=$3
    shift 3
    study_attempt=0
    while :; do
        study_status=0
        python3 "$here/guard.py" "$out/$study_name.guard.json" -- "$@" > "$study_result" 2> "$study_log" ||
            study_status=$?
        grep '^guard: ' "$study_log" >&2 || true
        grep -q '"disturbed": true' "$out/$study_name.guard.json" 2> /dev/null || return "$study_status"
        study_attempt=$((study_attempt + 1))
        [ "$study_attempt" -le "${GUARD_RETRIES:-2}" ] || return "$study_status"
        mv "$out/$study_name.guard.json" "$out/$study_name.disturbed-$study_attempt.guard.json"
        echo "$study: $study_name was disturbed by other load: running it again ($study_attempt of ${GUARD_RETRIES:-2})" >&2
    done
}

# One job in a test bed, under the load guard: study_bed_job NAME BED SECONDS JOB [ENV=VALUE...],
# BED the bed's script (scripts/nested-svm/bed.sh, scripts/arm64/bed.sh), JOB the script it
# runs in L1 within SECONDS; what the job leaves in /out lands in $out, its output in
# $out/NAME.bed.log. A failed job is said, not fatal (the study runs the rest; run again, it
# does what is missing). The caller's EXIT trap removes "$study_bed_out" if interrupted.
study_bed_job() {
    study_job_name=$1 study_bed=$2 study_seconds=$3 study_job=$4
    shift 4
    study_bed_out=$(mktemp -d "$out/.bed-out.XXXXXX")
    study_run "$study_job_name" "$out/$study_job_name.bed.err" "$out/$study_job_name.bed.log" \
        env BED_OUT="$study_bed_out" "$@" bash "$study_bed" run -t "$study_seconds" "$study_job" ||
        echo "$study: $study_job_name failed in the bed: see $out/$study_job_name.bed.log and $out/$study_job_name.bed.err" >&2
    for study_file in "$study_bed_out"/*; do [ -e "$study_file" ] && mv "$study_file" "$out/"; done
    rm -rf "$study_bed_out"
}

# Each boot recording's profile (`virtprof boot --recording`), unless one newer than it exists:
# study_boot_profiles MAP [ARGS...], MAP the kernel's symbols (or "per-run": each recording's
# own RUN.kallsyms, taken in the L1 that recorded it).
study_boot_profiles() {
    study_map=$1
    shift
    for study_rec in "$out"/*.vprec; do
        [ -e "$study_rec" ] || continue
        study_base=${study_rec%.vprec}
        [ -s "$study_base.boot.json" ] && [ "$study_base.boot.json" -nt "$study_rec" ] && continue
        [ "$study_map" = per-run ] && study_map_here=$study_base.kallsyms || study_map_here=$study_map
        "$virtprof" boot --recording "$study_rec" --system-map "$study_map_here" --top 40 "$@" \
            --json --html "$study_base.boot.html" > "$study_base.boot.json" 2> "$study_base.boot.err" ||
            { echo "$study: boot --recording $study_rec failed: $(cat "$study_base.boot.err")" >&2; rm -f "$study_base.boot.json"; }
    done
}

# The results folder: manifest.json and every run's small outputs (JSON, results, logs, guard
# verdicts; recordings only with KEEP_RECORDINGS) in runs.tar.xz, which table.py reads alone.
study_pack() {
    (cd "$out" && find . -maxdepth 1 -type f \( -name '*.json' -o -name '*.result' -o -name '*.log' \
        -o -name '*.txt' -o -name '*.html' -o -name '*.console' ${KEEP_RECORDINGS:+-o -name '*.vprec'} \) \
        ! -name runs.tar.xz -print |
        sed 's|^\./||' | LC_ALL=C sort | tar -cJf runs.tar.xz -T -)
    echo "$study: raw data in $out/runs.tar.xz ($(du -h "$out/runs.tar.xz" | cut -f1)); tables again: python3 benches/papers/table.py $out" >&2
}
