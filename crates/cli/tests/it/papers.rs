//! The studies' machinery (`benches/papers/`), without running a study: the load guard that
//! marks and repeats runs other load disturbed, the results folder whose tables are made again
//! from it alone, the pins that refuse other inputs, the XenMon placement in cgroup v1 or v2
//! groups, the open-loop load against servers that answer, stall, flood or refuse, and the
//! tables of the overhead and open-loop studies.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::util::{empty_dir, note, repo};

fn papers() -> PathBuf {
    repo().join("benches/papers")
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A python3 busy loop that spends `cpu_s` of its own CPU time, then touches `done` (if given)
/// and sleeps `then_sleep_s`.
fn busy(cpu_s: f64, done: Option<&Path>, then_sleep_s: f64) -> String {
    let touch = done.map(|d| format!("open('{}', 'w').close()\n", d.display())).unwrap_or_default();
    format!("import time\nwhile time.process_time() < {cpu_s}: pass\n{touch}time.sleep({then_sleep_s})\n")
}

/// guard.py around COMMAND with the given environment; its verdict.
fn guard(dir: &Path, name: &str, env: &[(&str, &str)], command: &[&str]) -> (Output, Value) {
    let report = dir.join(format!("{name}.guard.json"));
    let output = Command::new("python3")
        .arg(papers().join("guard.py"))
        .arg(&report)
        .arg("--")
        .args(command)
        .env("GUARD_WAIT", "0")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let verdict = json(&report);
    (output, verdict)
}

fn f64_of(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

#[test]
fn the_load_guard_counts_a_runs_own_cpu_and_its_neighbours_apart() {
    let dir = empty_dir("papers-guard");
    // The run's own CPU (a child it reaps): counted as the run's, not as other load. Ticks of
    // 10 ms and the python start-up bound the error.
    let (output, own) = guard(&dir, "own", &[], &["python3", "-c", &busy(1.0, None, 0.0)]);
    assert!(output.status.success(), "{}", text(&output));
    let run_cpu = f64_of(&own, "run_cpu_s");
    assert!((1.0..1.5).contains(&run_cpu), "the run spent 1 s of CPU, guard says {run_cpu}: {own}");
    assert_eq!(own["exit_code"], 0);

    // A neighbour the run did not start, busy through the run: other load, and the run is
    // marked disturbed.
    let mut hog = Command::new("python3").args(["-c", &busy(1e9, None, 0.0)]).spawn().unwrap();
    let (_, beside) = guard(&dir, "beside", &[("GUARD_OTHER_PCT", "5")], &["python3", "-c", &busy(1.0, None, 0.0)]);
    hog.kill().unwrap();
    hog.wait().unwrap();
    let wall = f64_of(&beside, "wall_s");
    let other = f64_of(&beside, "other_cpu_s");
    // The hog had one of the host's CPUs for most of the run (the run the other).
    assert!(other >= 0.5 * wall, "a neighbour busy through a {wall} s run took only {other} s: {beside}");
    assert_eq!(beside["disturbed"], true, "{beside}");
    let reasons = beside["reasons"].as_array().unwrap();
    assert!(reasons.iter().any(|r| r.as_str().unwrap().contains("other tasks took")), "{beside}");

    // A process the run starts and leaves running (as thermal.sh's balancer): other load, unless
    // its pid file is named in GUARD_ALSO_PIDFILES.
    for (name, also) in [("orphan", false), ("named", true)] {
        let pidfile = dir.join(format!("{name}.pid"));
        let done = dir.join(format!("{name}.done"));
        let script = format!(
            "python3 -c \"$BUSY\" > /dev/null 2>&1 & echo $! > {pid}; i=0; while [ ! -e {done} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done",
            pid = pidfile.display(),
            done = done.display()
        );
        let pidfiles = pidfile.display().to_string();
        let mut env = vec![("BUSY", busy(0.8, Some(&done), 30.0))];
        if also {
            env.push(("GUARD_ALSO_PIDFILES", pidfiles));
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (output, verdict) = guard(&dir, name, &env, &["sh", "-c", &script]);
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_string();
        let _ = Command::new("kill").arg(&pid).status();
        assert!(output.status.success(), "{}", text(&output));
        let run_cpu = f64_of(&verdict, "run_cpu_s");
        if also {
            assert!(run_cpu >= 0.75, "the named process spent 0.8 s: the run's CPU is {run_cpu}: {verdict}");
        } else {
            assert!(run_cpu < 0.5, "an orphan's CPU is not the run's: {verdict}");
            assert!(f64_of(&verdict, "other_cpu_s") >= 0.7, "an orphan's CPU is other load: {verdict}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `sh -c SCRIPT` with benches/papers/common.sh sourced as a study sources it.
fn with_common(out: &Path, script: &str, env: &[(&str, &str)]) -> Output {
    let prelude = format!(
        "set -eu\nhere={papers}\nroot={root}\nout={out}\nstudy=test.sh\n. \"$here/common.sh\"\n",
        papers = papers().display(),
        root = repo().display(),
        out = out.display()
    );
    Command::new("sh").arg("-c").arg(prelude + script).envs(env.iter().copied()).output().unwrap()
}

#[test]
fn a_disturbed_run_is_run_again_and_every_verdict_kept() {
    let out = empty_dir("papers-retry");
    // A limit no run can meet: every attempt is disturbed.
    let output = with_common(
        &out,
        "status=0\nstudy_run one \"$out/one.log\" \"$out/one.result\" sh -c 'echo WG-RESULT ops=1; exit 3' || status=$?\necho \"status $status\"",
        &[("GUARD_WAIT", "0"), ("GUARD_OTHER_PCT", "-1"), ("GUARD_RETRIES", "2")],
    );
    let said = text(&output);
    assert!(said.contains("status 3"), "study_run returns the command's exit code: {said}");
    assert_eq!(said.matches("running it again").count(), 2, "two retries: {said}");
    for kept in ["one.guard.json", "one.disturbed-1.guard.json", "one.disturbed-2.guard.json"] {
        assert_eq!(json(&out.join(kept))["disturbed"], true, "{kept}");
    }
    assert!(std::fs::read_to_string(out.join("one.result")).unwrap().contains("WG-RESULT"));
    // An undisturbed run is run once.
    let output = with_common(
        &out,
        "study_run two \"$out/two.log\" \"$out/two.result\" true",
        &[("GUARD_WAIT", "0"), ("GUARD_OTHER_PCT", "1000"), ("GUARD_STEAL_PCT", "1000")],
    );
    assert!(output.status.success(), "{}", text(&output));
    assert!(!text(&output).contains("running it again"));
    assert_eq!(json(&out.join("two.guard.json"))["disturbed"], false);
    std::fs::remove_dir_all(&out).unwrap();
}

fn result_line(ops: u32) -> String {
    format!("WG-RESULT workload=stress ops={ops} seconds=10 unit=cpu-bogo-ops\n")
}

#[test]
fn a_results_folder_makes_its_tables_alone_leaving_out_disturbed_runs() {
    let out = empty_dir("papers-results");
    // A VrtProf folder of five runs a side (no compare output): native 100..140 ops, guest
    // 10, 20, 30, 40 and a disturbed fifth of 1 000.
    for (i, ops) in [100, 110, 120, 130, 140].into_iter().enumerate() {
        std::fs::write(out.join(format!("stress-native-{}.result", i + 1)), result_line(ops)).unwrap();
    }
    for (i, ops) in [10, 20, 30, 40, 1000].into_iter().enumerate() {
        std::fs::write(out.join(format!("stress-guest-{}.result", i + 1)), result_line(ops)).unwrap();
    }
    let guard = |disturbed: bool| {
        format!(
            r#"{{"disturbed": {disturbed}, "reasons": {}}}"#,
            if disturbed { r#"["other tasks took 40.0 % of the CPUs (limit 10 %)"]"# } else { "[]" }
        )
    };
    for side in ["native", "guest"] {
        for i in 1..=5 {
            let disturbed = side == "guest" && i == 5;
            std::fs::write(out.join(format!("stress-{side}-{i}.guard.json")), guard(disturbed)).unwrap();
        }
    }
    std::fs::write(
        out.join("manifest.json"),
        r#"{"study": "vrtprof", "parameters": {"WORKLOADS": "stress"}, "virtprof": "virtprof test", "accel_why": "test"}"#,
    )
    .unwrap();
    let packed = with_common(&out, "study_pack", &[]);
    assert!(packed.status.success(), "{}", text(&packed));
    // The folder alone: the manifest and the archive.
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        if !path.ends_with("runs.tar.xz") && !path.ends_with("manifest.json") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let table = Command::new("python3").arg(papers().join("table.py")).arg(&out).output().unwrap();
    let said = text(&table);
    assert!(table.status.success(), "{said}");
    // Means with their spread and n; the disturbed run left out and named.
    assert!(said.contains("| stress | cpu-bogo-ops/s | 12.0 ± 1.6 (n=5) | 2.5 ± 1.3 (n=4) | 0.208 |"), "{said}");
    assert!(said.contains("Left out as disturbed by other load (1 runs"), "{said}");
    assert!(said.contains("- stress-guest-5: other tasks took 40.0 %"), "{said}");
    assert!(said.contains("all.json"), "the correlation tables say what they lack: {said}");

    // Hostile folders: no manifest, an unknown study, an archive member outside the folder.
    let run = |dir: &Path| Command::new("python3").arg(papers().join("table.py")).arg(dir).output().unwrap();
    let empty = empty_dir("papers-results-empty");
    assert_eq!(run(&empty).status.code(), Some(2), "no manifest");
    std::fs::write(empty.join("manifest.json"), r#"{"study": "nope"}"#).unwrap();
    let unknown = run(&empty);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown).contains("unknown study 'nope'"), "{}", text(&unknown));
    std::fs::write(empty.join("manifest.json"), r#"{"study": "vrtprof"}"#).unwrap();
    let evil = Command::new("python3")
        .arg("-c")
        .arg("import io, sys, tarfile\nt = tarfile.open(sys.argv[1], 'w:xz')\ni = tarfile.TarInfo('../escaped')\ni.size = 1\nt.addfile(i, io.BytesIO(b'x'))\nt.close()")
        .arg(empty.join("runs.tar.xz"))
        .status()
        .unwrap();
    assert!(evil.success());
    let refused = run(&empty);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("refusing member '../escaped'"), "{}", text(&refused));
    assert!(!empty.parent().unwrap().join("escaped").exists());
    // A member whose header claims 2 GiB: refused before anything is unpacked. An archive cut
    // short: damaged, said so.
    let lying = Command::new("python3")
        .arg("-c")
        .arg(
            "import io, lzma, sys, tarfile
b = io.BytesIO()
t = tarfile.open(fileobj=b, mode='w', format=tarfile.USTAR_FORMAT)
i = tarfile.TarInfo('a.result')
i.size = 10
t.addfile(i, io.BytesIO(b'x' * 10))
t.close()
r = bytearray(b.getvalue())
r[124:136] = b'%011o\\0' % (2 << 30)
r[148:156] = b' ' * 8
r[148:156] = b'%06o\\0 ' % sum(r[:512])
open(sys.argv[1], 'wb').write(lzma.compress(bytes(r)))",
        )
        .arg(empty.join("runs.tar.xz"))
        .status()
        .unwrap();
    assert!(lying.success());
    let refused = run(&empty);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("claim over 1024 MiB"), "{}", text(&refused));
    let whole = std::fs::read(out.join("runs.tar.xz")).unwrap();
    std::fs::write(empty.join("runs.tar.xz"), &whole[..whole.len() / 2]).unwrap();
    let cut = run(&empty);
    assert_eq!(cut.status.code(), Some(2), "{}", text(&cut));
    assert!(text(&cut).contains("is damaged"), "{}", text(&cut));
    std::fs::remove_dir_all(&empty).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_study_refuses_inputs_other_than_the_pinned_ones_unless_told() {
    let target = empty_dir("papers-pins");
    std::fs::create_dir_all(target.join("nested-svm")).unwrap();
    std::fs::write(target.join("nested-svm/linux-image-9.9.9-amd64_9.9.9-1_amd64.deb"), "not Debian's").unwrap();
    let manifest = target.join("out/manifest.json");
    let write = |unpinned: bool| {
        let mut command = Command::new("python3");
        command
            .arg(papers().join("manifest.py"))
            .arg(&manifest)
            .args(["test", "/bin/true", "tcg", "no VT here", "RUNS=5"])
            .env("STUDY_TARGET", &target)
            .env("STUDY_INPUTS", "kernel")
            .env_remove("STUDY_UNPINNED");
        if unpinned {
            command.env("STUDY_UNPINNED", "1");
        }
        command.output().unwrap()
    };
    let refused = write(false);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    let said = text(&refused);
    assert!(said.contains("kernel/linux-image-9.9.9-amd64_9.9.9-1_amd64.deb is not pinned"), "{said}");
    assert!(said.contains("kernel/linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb (pinned) is not in"), "{said}");
    assert!(!manifest.exists(), "nothing written when refused");

    let told = write(true);
    assert!(told.status.success(), "{}", text(&told));
    let m = json(&manifest);
    assert_eq!(m["inputs_pinned"], false);
    assert_eq!(m["inputs_differences"].as_array().unwrap().len(), 2, "{m}");
    assert_eq!(m["parameters"]["RUNS"], "5");
    assert_eq!(m["accel"], "tcg");
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(m["host"]["cpus"].as_u64(), Some(cpus as u64), "{m}");
    std::fs::remove_dir_all(&target).unwrap();
}

#[test]
fn run_sh_says_which_studies_there_are() {
    for (args, said) in
        [(vec![], "usage: run.sh STUDY"), (vec!["nope"], "unknown study 'nope' (vrtprof, overhead, xenmon")]
    {
        let output = Command::new("bash").arg(papers().join("run.sh")).args(&args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", text(&output));
        assert!(text(&output).contains(said), "{args:?}: {}", text(&output));
    }
}

/// A process with threads named as QEMU names them: "CPU 0/KVM", "CPU 1/KVM" and an I/O thread.
struct FakeQemu(std::process::Child);

impl FakeQemu {
    fn start(dir: &Path) -> FakeQemu {
        let ready = dir.join("fake-qemu.ready");
        let script = format!(
            "import os, threading, time\n\
             def named(name):\n    open(f'/proc/self/task/{{threading.get_native_id()}}/comm', 'w').write(name)\n    time.sleep(600)\n\
             for n in ['CPU 0/KVM', 'CPU 1/KVM', 'iothread0']:\n    threading.Thread(target=named, args=(n,), daemon=True).start()\n\
             time.sleep(0.5)\nopen('{}', 'w').close()\ntime.sleep(600)\n",
            ready.display()
        );
        let child = Command::new("python3").arg("-c").arg(script).spawn().unwrap();
        for _ in 0..100 {
            if ready.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(ready.exists(), "the fake QEMU never named its threads");
        FakeQemu(child)
    }

    /// Each thread's comm and the file listing it in `group`/`member` under `base`.
    fn placed(&self, base: &Path, member: &str) -> Vec<(String, String)> {
        let pid = self.0.id();
        let mut out = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let task = task.unwrap().path();
            let tid = task.file_name().unwrap().to_string_lossy().to_string();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap().trim().to_string();
            let group = ["vcpu", "io"]
                .into_iter()
                .find(|g| std::fs::read_to_string(base.join(g).join(member)).unwrap().lines().any(|l| l == tid))
                .unwrap_or("none");
            out.push((comm, group.to_string()));
        }
        out
    }
}

impl Drop for FakeQemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn xenmon_places_vcpu_threads_and_the_rest_in_two_weighted_groups() {
    let test = "xenmon_places_vcpu_threads_and_the_rest_in_two_weighted_groups";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        note(test, "SKIP: needs root for cgroups");
        return;
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let v2 = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .find(|m| {
            std::fs::read_to_string(m.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"))
        });
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    let mut tried = 0;
    for (version, root) in [("v2", v2), ("v1", v1.join("cgroup.procs").exists().then(|| v1.to_path_buf()))] {
        let Some(root) = root else {
            note(test, format!("SKIP {version}: this host's cgroup {version} has no cpu controller"));
            continue;
        };
        tried += 1;
        let dir = empty_dir(&format!("papers-place-{version}"));
        let base = root.join(format!("virtprof-it-xenmon-{}", std::process::id()));
        let qemu = FakeQemu::start(&dir);
        let output = Command::new("sh")
            .arg(papers().join("xenmon_place.sh"))
            .arg(qemu.0.id().to_string())
            .env("XENMON_RATIO", "0.5")
            .env("XENMON_BASE", &base)
            .env("XENMON_CGROUP", version)
            .output()
            .unwrap();
        assert!(output.status.success(), "{version}: {}", text(&output));
        let (member, weight, vcpu_weight, io_weight) = if version == "v2" {
            ("cgroup.threads", "cpu.weight", "100", "50")
        } else {
            ("tasks", "cpu.shares", "1024", "512")
        };
        for (comm, group) in qemu.placed(&base, member) {
            let want = if comm.starts_with("CPU") { "vcpu" } else { "io" };
            assert_eq!(group, want, "{version}: thread {comm:?}");
        }
        assert_eq!(std::fs::read_to_string(base.join("vcpu").join(weight)).unwrap().trim(), vcpu_weight);
        assert_eq!(std::fs::read_to_string(base.join("io").join(weight)).unwrap().trim(), io_weight);
        drop(qemu);
        // The groups go once their threads are gone, as xenmon.sh's exit trap does it.
        for group in [base.join("vcpu"), base.join("io"), base.clone()] {
            for _ in 0..100 {
                if std::fs::remove_dir(&group).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            assert!(!group.exists(), "{} left behind", group.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    if tried == 0 {
        note(test, "SKIP: no cgroup cpu controller (v2 or v1) on this host");
    }
}

/// Decimal numbers in `text` ("+0.83", "1,197.8", "−0.02"), as the tables print them.
fn decimals(text: &str) -> Vec<String> {
    let text = text.replace('−', "-");
    let mut out = Vec::new();
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts =
            bytes[i].is_ascii_digit() && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == '.'));
        if !starts {
            i += 1;
            continue;
        }
        let from = if i > 0 && (bytes[i - 1] == '+' || bytes[i - 1] == '-') { i - 1 } else { i };
        let mut j = i;
        while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == ',' || bytes[j] == '.') {
            j += 1;
        }
        let token: String = bytes[from..j].iter().collect::<String>().trim_end_matches([',', '.']).to_string();
        if token.contains('.') {
            out.push(token);
        }
        i = j;
    }
    out
}

#[test]
fn committed_results_make_their_tables_again_and_papers_md_quotes_only_their_numbers() {
    let results = repo().join("benches/results/papers");
    let mut folders = 0;
    for entry in std::fs::read_dir(&results).unwrap() {
        let folder = entry.unwrap().path();
        if !folder.join("manifest.json").exists() {
            continue;
        }
        folders += 1;
        let made = Command::new("python3").arg(papers().join("table.py")).arg(&folder).output().unwrap();
        assert!(made.status.success(), "{}: {}", folder.display(), text(&made));
        let committed = std::fs::read_to_string(folder.join("table.md")).unwrap();
        assert!(
            String::from_utf8_lossy(&made.stdout) == committed,
            "{}: table.md is not what table.py makes from the folder",
            folder.display()
        );
    }
    assert!(folders > 0, "no results folder under {}", results.display());
    // Each block of docs/papers.md that says where its numbers come from quotes only numbers
    // that table has.
    let papers_md = std::fs::read_to_string(repo().join("docs/papers.md")).unwrap();
    let mut blocks = 0;
    for block in papers_md.split("<!-- numbers from ").skip(1) {
        let (source, rest) = block.split_once(" -->").unwrap();
        let (quoted, _) = rest.split_once("<!-- end of numbers -->").expect("a numbers block ends");
        let table = std::fs::read_to_string(repo().join(source))
            .unwrap_or_else(|e| panic!("docs/papers.md quotes {source}: {e}"))
            .replace('−', "-");
        let numbers = decimals(quoted);
        assert!(!numbers.is_empty(), "the block from {source} quotes no number");
        for number in numbers {
            assert!(table.contains(&number), "docs/papers.md quotes {number}, which {source} does not have");
        }
        blocks += 1;
    }
    assert!(blocks > 0, "docs/papers.md has no block of numbers from a results folder");
}

/// A loopback server in Python, kind "count" (answers each GET with 200 and counts requests in
/// `count_file` as it stops), "silent" (accepts, never answers), "flood" (answers with a body
/// that never ends); its port once it listens. Stopped (killed) when dropped.
struct Server(std::process::Child, u16);

impl Server {
    fn start(dir: &Path, kind: &str) -> Server {
        let port_file = dir.join(format!("{kind}.port"));
        let count_file = dir.join(format!("{kind}.count"));
        let script = format!(
            r#"import http.server, signal, socket, socketserver, sys, threading, time
kind = "{kind}"
served = 0
lock = threading.Lock()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global served
        with lock:
            served += 1
        if kind == "silent":
            time.sleep(60)
        elif kind == "flood":
            self.send_response(200)
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"x" * 65536)
            except OSError:
                return
        else:
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")
    def log_message(self, *a):
        pass
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 1024
s = Server(("127.0.0.1", 0), Handler)
def stop(*_):
    open("{count}", "w").write(str(served))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open("{port}.tmp", "w").write(str(s.server_address[1]))
import os; os.rename("{port}.tmp", "{port}")
s.serve_forever()
"#,
            count = count_file.display(),
            port = port_file.display(),
        );
        // Owned at once: a server that never listens is killed by the drop of the panic.
        let mut server = Server(Command::new("python3").arg("-c").arg(script).spawn().unwrap(), 0);
        for _ in 0..200 {
            if let Ok(port) = std::fs::read_to_string(&port_file) {
                server.1 = port.trim().parse().unwrap();
                return server;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("the {kind} server never listened");
    }

    /// Stop it; the requests it counted.
    fn stop(mut self, dir: &Path, kind: &str) -> u64 {
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
        std::fs::read_to_string(dir.join(format!("{kind}.count"))).unwrap().trim().parse().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn open_loop(args: &[&str]) -> (Output, std::collections::BTreeMap<String, String>) {
    let output =
        Command::new("python3").arg(repo().join("scripts/workload-guest/openloop.py")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let pairs = stdout
        .lines()
        .find(|l| l.starts_with("WG-RESULT "))
        .map(|l| l.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect())
        .unwrap_or_default();
    (output, pairs)
}

fn count(pairs: &std::collections::BTreeMap<String, String>, key: &str) -> u64 {
    pairs.get(key).unwrap_or_else(|| panic!("{key} in {pairs:?}")).parse().unwrap()
}

/// The XenMon study's open-loop load (openloop.py, httperf's --rate): every request of the
/// schedule is sent whatever the server does, each ends by its deadline, and the result line
/// counts what came of each, against a server that counts what it got.
#[test]
fn an_open_loop_load_sends_its_schedule_whatever_the_server_does() {
    let dir = empty_dir("papers-openloop");
    let url = |port: u16| format!("http://127.0.0.1:{port}/index.html");

    // A server that answers: 100 a second for 2 s is 200 requests sent, got and answered.
    let server = Server::start(&dir, "count");
    let (output, r) = open_loop(&["--rate", "100", "--seconds", "2", &url(server.1)]);
    assert!(output.status.success(), "{}", text(&output));
    let got = server.stop(&dir, "count");
    assert_eq!((count(&r, "sent"), count(&r, "unsent")), (200, 0), "{r:?}");
    assert_eq!(got, 200, "the server got every request sent: {r:?}");
    assert_eq!((count(&r, "replies"), count(&r, "ops"), count(&r, "errors"), count(&r, "timeouts")), (200, 200, 0, 0));
    assert!(r["latency_avg_us"].parse::<f64>().unwrap() > 0.0, "{r:?}");

    // A server that never answers: each request ends at its deadline, and beyond --max-open
    // requests are counted unsent, not queued.
    let silent = Server::start(&dir, "silent");
    let (output, r) =
        open_loop(&["--rate", "50", "--seconds", "1", "--timeout", "0.5", "--max-open", "10", &url(silent.1)]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(count(&r, "sent") + count(&r, "unsent"), 50, "{r:?}");
    assert_eq!(count(&r, "timeouts"), count(&r, "sent"), "{r:?}");
    assert!(count(&r, "unsent") > 0, "at most 10 in flight: {r:?}");
    assert_eq!((count(&r, "replies"), r["latency_avg_us"].as_str()), (0, "unknown"), "no reply, no latency: {r:?}");
    drop(silent);

    // A server whose reply never ends: read and dropped until the deadline (memory bounded).
    let flood = Server::start(&dir, "flood");
    let (output, r) = open_loop(&["--rate", "10", "--seconds", "1", "--timeout", "0.5", &url(flood.1)]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!((count(&r, "sent"), count(&r, "timeouts"), count(&r, "replies")), (10, 10, 0), "{r:?}");
    drop(flood);

    // Nobody listening: every request an error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (output, r) = open_loop(&["--rate", "20", "--seconds", "1", &url(port)]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!((count(&r, "sent"), count(&r, "errors"), count(&r, "replies")), (20, 20, 0), "{r:?}");

    for (args, says) in [
        (vec!["--rate", "0", "--seconds", "1", "http://127.0.0.1:1/"], "--rate takes requests per second above 0"),
        (vec!["--rate", "5", "--seconds", "1", "ftp://127.0.0.1/"], "is not an http:// URL"),
        (vec!["--rate", "5", "--seconds", "-1", "http://127.0.0.1:1/"], "--seconds takes a time above 0"),
    ] {
        let (output, _) = open_loop(&args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", text(&output));
        assert!(text(&output).contains(says), "{args:?}: {}", text(&output));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The overhead study's table (VrtProf Table IV) from a folder of runs: each condition's rate
/// with its spread, the overhead as time per operation recorded over not, with its standard
/// error, and the events the recordings held and lost.
#[test]
fn the_overhead_table_gives_each_overhead_with_its_error() {
    let out = empty_dir("papers-overhead");
    for (i, (bare, recorded)) in [(100, 90), (102, 92), (98, 88)].into_iter().enumerate() {
        std::fs::write(out.join(format!("stress-bare-{}.result", i + 1)), result_line(bare)).unwrap();
        std::fs::write(out.join(format!("stress-100ms-{}.result", i + 1)), result_line(recorded)).unwrap();
        std::fs::write(
            out.join(format!("stress-100ms-{}.recorded.json", i + 1)),
            format!(r#"{{"events": 10000, "lost_events": {i}, "duration_s": 10.0}}"#),
        )
        .unwrap();
        for condition in ["bare", "100ms"] {
            std::fs::write(out.join(format!("stress-{condition}-{}.guard.json", i + 1)), r#"{"disturbed": false}"#)
                .unwrap();
        }
    }
    std::fs::write(
        out.join("manifest.json"),
        r#"{"study": "overhead", "parameters": {"WORKLOADS": "stress sqlite", "INTERVALS": "100ms"}}"#,
    )
    .unwrap();
    let table = Command::new("python3").arg(papers().join("table.py")).arg(&out).output().unwrap();
    let said = text(&table);
    assert!(table.status.success(), "{said}");
    // 100/90 - 1 = +11.1 %; the standard error from sd 2 over means 100 and 90, n = 3 each.
    let se = 100.0 / 90.0 * ((2.0f64 / 100.0).powi(2) / 3.0 + (2.0f64 / 90.0).powi(2) / 3.0).sqrt();
    let row = format!(
        "| stress | cpu-bogo-ops/s | 10.0 ± 0.2 (n=3) | 9.000 ± 0.200 (n=3) | +11.1 % ± {:.1} | yes | 1,000 | 3 |",
        100.0 * se
    );
    assert!(said.contains(&row), "{row}\n{said}");
    assert!(said.contains("| sqlite | /s | - | - | - | - | - | 0 |"), "a workload without runs: {said}");
    assert!(said.contains("Geometric mean of the overheads' sizes over 1 workloads: 11.1 %"), "{said}");
    std::fs::remove_dir_all(&out).unwrap();
}

/// The open-loop XenMon table: steps are offered rates, with what failed and what the client
/// could not send on time beside the throughput.
#[test]
fn the_open_loop_xenmon_table_steps_offered_rates() {
    let out = empty_dir("papers-xenmon-open");
    let role = |name: &str, cpus: f64| {
        format!(
            r#"{{"role": "{name}", "cpus": {cpus}, "waiting_pct": 10.0, "blocked_pct": 20.0, "execs_per_s": 100.0,
                "cpu_per_exec_us": 30.0, "exec_count": 800}}"#
        )
    };
    let sched = format!(
        r#"{{"lost_events": 0, "windows": [{{"vms": [{{"kind": "qemu", "roles": [{}, {}]}}]}}]}}"#,
        role("vcpu", 0.8),
        role("main-loop", 0.1)
    );
    for (i, (replies, failed)) in [(1900, 100), (2000, 0)].into_iter().enumerate() {
        // Not with_extension: "conf0.5-..." has a dot of its own.
        let file = |suffix: &str| out.join(format!("conf0.5-r250-{}.{suffix}", i + 1));
        std::fs::write(
            file("result"),
            format!(
                "WG-RESULT name=web seconds=8.00 ops={replies} unit=requests offered_per_s=250 sent=2000 \
                 replies={replies} errors={failed} timeouts=0 unsent=0 late=4 latency_avg_us=1500.0 latency_p99_us=9000.0\n"
            ),
        )
        .unwrap();
        std::fs::write(file("sched.json"), &sched).unwrap();
        std::fs::write(file("report.json"), r#"{"guests": []}"#).unwrap();
        std::fs::write(file("guard.json"), r#"{"disturbed": false}"#).unwrap();
    }
    std::fs::write(
        out.join("manifest.json"),
        r#"{"study": "xenmon", "parameters": {"RATIOS": "0.5", "CONNECTIONS": "1 4", "RATES": "250 500"}}"#,
    )
    .unwrap();
    let table = Command::new("python3").arg(papers().join("table.py")).arg(&out).output().unwrap();
    let said = text(&table);
    assert!(table.status.success(), "{said}");
    assert!(
        said.contains("| I/O : vCPU | offered req/s | runs | req/s | latency ms | failed or timed out |"),
        "{said}"
    );
    // 1 900 and 2 000 replies in 8 s: 237.5 and 250 req/s; 50 failed and 4 sent late a run.
    assert!(said.contains("| 0.5 | 250 | 2 | 244 ± 9 | 1.50 | 50 | 4 | 80.0 | 10.0 |"), "{said}");
    assert!(said.contains("| 0.5 | 500 | 0 | (every run failed: see its log) |"), "{said}");
    std::fs::remove_dir_all(&out).unwrap();
}
