#!/usr/bin/env python3
"""Every table of a study again, from its results folder alone.

    python3 benches/papers/table.py DIR

DIR holds what a study wrote (benches/papers/run.sh STUDY, or the study script itself):
manifest.json (the study and its parameters) and either the runs' files or runs.tar.xz with
them. The tables come from the same script the study ran, on those files only: nothing is
taken from this machine, so anyone can check a number docs/papers.md quotes.
"""

import json
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# Each study's table script and the manifest parameters it takes, in order, with the
# defaults its study script uses.
TABLES = {
    "xenmon": ("xenmon_table.py", [("RATIOS", "0.5 1 2 10"), ("CONNECTIONS", "1 4 16 64"), ("RATES", "")]),
    "thermal": ("thermal_table.py", [("HZ", "0 1 10 20 100 1000"), ("WORKLOADS", "iperf build")]),
    "vrtprof": ("vrtprof_table.py", [("WORKLOADS", "stress sqlite compress build web")]),
    "overhead": ("overhead_table.py", [("WORKLOADS", "stress sqlite compress build web"), ("INTERVALS", "100ms")]),
    "bootprof": ("bootprof_table.py", [("RUNS", "3"), ("USERLAND_RUNS", "0")]),
    "bootprof-arm64": ("bootprof_table.py", [("RUNS", "5")]),
    "osnoise": ("osnoise_table.py", [("RUNS", "3")]),
}


# A study's runs take a few MB unpacked; an archive claiming more is refused, not unpacked.
UNPACKED_LIMIT = 1 << 30


def refuse(why):
    """Bad input: say what and where, exit 2."""
    print(f"table.py: {why}", file=sys.stderr)
    sys.exit(2)


def unpack(archive, into):
    """Unpack runs.tar.xz, refusing members that are not plain files in its top folder and
    archives past UNPACKED_LIMIT; a damaged archive is said so (exit 2)."""
    total = 0
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for member in tar:
                name = member.name
                if not member.isfile() or "/" in name or name in ("", ".", ".."):
                    refuse(f"{archive}: refusing member {name!r} (not a plain file at the top)")
                total += member.size
                if total > UNPACKED_LIMIT:
                    refuse(f"{archive}: its members claim over {UNPACKED_LIMIT >> 20} MiB; refusing it")
                with tar.extractfile(member) as src, open(os.path.join(into, name), "wb") as dst:
                    while block := src.read(1 << 20):
                        dst.write(block)
    except (tarfile.TarError, EOFError, lzma.LZMAError) as e:
        refuse(f"{archive} is damaged ({e}); make it again with the study (run.sh)")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    try:
        with open(os.path.join(folder, "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        print(f"table.py: {folder}/manifest.json: {e} (a study's results folder has one)", file=sys.stderr)
        sys.exit(2)
    study = manifest.get("study")
    if study not in TABLES:
        print(f"table.py: {folder}: unknown study {study!r} (known: {', '.join(TABLES)})", file=sys.stderr)
        sys.exit(2)
    script, params = TABLES[study]
    args = [manifest.get("parameters", {}).get(key, default) for key, default in params]
    archive = os.path.join(folder, "runs.tar.xz")
    with tempfile.TemporaryDirectory() as scratch:
        runs = folder
        if os.path.exists(archive):
            unpack(archive, scratch)
            runs = scratch
        made = subprocess.run([sys.executable, os.path.join(HERE, script), runs, *args], stdout=subprocess.PIPE)
    head = (f"<!-- {study}: {manifest.get('virtprof')}, {manifest.get('accel_why')}, "
            f"started {manifest.get('started_utc')} -->\n")
    try:
        sys.stdout.buffer.write(head.encode() + made.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        # A reader that stopped early (`| head`) got what it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        print(f"table.py: writing the tables: {e.strerror}", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return made.returncode


if __name__ == "__main__":
    sys.exit(main())
