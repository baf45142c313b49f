//! What virtprof is installed from (issue 57): `--version` with its commit, man pages and
//! completions from the CLI definition, the static binary alone in an empty root, the Debian
//! package installed into a scratch root and removed, the systemd unit's capabilities, the
//! alerting rules against series recorded from a real serve, and the Kubernetes manifests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::agent::{free_port, report_json, token_file};
use super::docs::listed_commands;
use super::serve::{scrape, Served};
use super::util::{have_kvm, note, repo, static_binary, temp, virtprof};

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let test = "version_names_the_commit_it_was_built_from";
    let version = run(virtprof().arg("--version"));
    assert!(version.starts_with(&format!("virtprof {} (", env!("CARGO_PKG_VERSION"))), "{version}");
    match Command::new("git").current_dir(repo()).args(["rev-parse", "--short=12", "HEAD"]).output() {
        Ok(out) if out.status.success() => {
            let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert_eq!(version.trim(), format!("virtprof {} ({head})", env!("CARGO_PKG_VERSION")));
        }
        _ => note(test, "no git here: the commit is not compared"),
    }
    // Every command says the same.
    let serve = run(virtprof().args(["serve", "--version"]));
    assert_eq!(serve.strip_prefix("virtprof-serve"), version.strip_prefix("virtprof"));
}

#[test]
fn man_pages_and_completions_come_from_the_command_line_definition() {
    let test = "man_pages_and_completions_come_from_the_command_line_definition";
    let dir = temp("man");
    let said = run(virtprof().arg("manpages").arg(&dir));
    // One page per command the help lists, and virtprof(1).
    let help = run(virtprof().arg("--help"));
    let commands = listed_commands(&help);
    assert!(commands.len() >= 20, "{help}");
    for command in &commands {
        assert!(dir.join(format!("virtprof-{command}.1")).is_file(), "no page for {command}: {said}");
    }
    assert!(dir.join("virtprof.1").is_file());
    if have("man") {
        let page = run(Command::new("man").arg("-l").arg(dir.join("virtprof-explain.1")).env("MANWIDTH", "100"));
        assert!(page.contains("NAME") && page.contains("virtprof-explain") && page.contains("--json"), "{page}");
    } else {
        note(test, "no man here: the pages are not rendered");
    }
    let _ = std::fs::remove_dir_all(&dir);

    let bash = run(virtprof().args(["completions", "bash"]));
    assert!(bash.contains("complete -F _virtprof") && bash.contains("explain"), "{bash}");
    let file = temp("completion.bash");
    std::fs::write(&file, &bash).unwrap();
    run(Command::new("bash").arg("-n").arg(&file));
    let _ = std::fs::remove_file(&file);
    assert!(run(virtprof().args(["completions", "zsh"])).contains("#compdef virtprof"));
    assert!(run(virtprof().args(["completions", "fish"])).contains("complete -c virtprof"));
    // A reader that closes early is no failure; a shell that does not exist is a usage error.
    let mut child = virtprof().args(["completions", "bash"]).stdout(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    assert!(child.wait().unwrap().success());
    let out = virtprof().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The static binary: no dynamic dependencies, and `virtprof agent` in a root holding only it
/// (and the kernel's /proc and /sys) feeds a host's `record --agent`.
#[test]
fn the_static_binary_runs_alone_as_the_guest_agent() {
    let test = "the_static_binary_runs_alone_as_the_guest_agent";
    let Some(binary) = static_binary(test) else { return };
    let ldd = Command::new("ldd").arg(&binary).output().unwrap();
    let said = String::from_utf8_lossy(&ldd.stdout).to_string() + &String::from_utf8_lossy(&ldd.stderr);
    assert!(said.contains("not a dynamic executable") || said.contains("statically linked"), "ldd: {said}");
    if have("file") {
        let file = run(Command::new("file").arg(&binary));
        assert!(file.contains("static"), "{file}");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !have("unshare") {
        note(test, "SKIP: the empty-root agent needs root and unshare");
        return;
    }
    let root = temp("static-root");
    let _ = std::fs::remove_dir_all(&root);
    for dir in ["proc", "sys", "tmp"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::copy(&binary, root.join("virtprof")).unwrap();
    let token = token_file("static-agent");
    std::fs::copy(&token, root.join("tmp/token")).unwrap();
    let port = free_port();
    // A private mount namespace: the binds go with the process, whatever ends it.
    let script = format!(
        "mount --bind /proc {r}/proc && mount --bind /sys {r}/sys && exec chroot {r} /virtprof agent \
         --listen tcp:127.0.0.1:{port} --token-file /tmp/token --interval 100ms --sessions 1",
        r = root.display()
    );
    let mut agent = Command::new("unshare").args(["-m", "sh", "-c", &script]).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut stderr, &mut line).unwrap_or(0) > 0 && !line.contains("listening") {}
    assert!(line.contains("listening"), "the agent did not start: {line}");
    let rec = temp("static-agent.vprec");
    let out = virtprof()
        .args(["record", "-d", "1s", "--agent", &format!("tcp:127.0.0.1:{port}"), "--agent-token-file"])
        .arg(&token)
        .arg("-o")
        .arg(&rec)
        .output()
        .unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(out.status.success(), "record: {}", String::from_utf8_lossy(&out.stderr));
    // The agent ran on this very kernel: it reports this host's release and CPUs.
    let report = report_json(&rec);
    let guests = report["guests"].as_array().unwrap();
    assert_eq!(guests.len(), 1, "{}", report["guests"]);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(guests[0]["kernel"], release.trim(), "{}", guests[0]);
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } as u64;
    assert_eq!(guests[0]["cpus"].as_u64(), Some(cpus), "{}", guests[0]);
    for path in [&rec, &token] {
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The Debian package: installed into a scratch root, it holds the static binary, man pages
/// `man -l` renders, completions and a unit `systemd-analyze verify` accepts; purged, it
/// leaves nothing.
#[test]
fn the_debian_package_installs_into_a_scratch_root_and_purges_clean() {
    let test = "the_debian_package_installs_into_a_scratch_root_and_purges_clean";
    let Some(binary) = static_binary(test) else { return };
    let deb = std::fs::read_dir(binary.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .expect("scripts/package.sh made a .deb beside the binary");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !have("dpkg") {
        note(test, "SKIP: installing into a scratch root needs root and dpkg");
        return;
    }
    let root = temp("deb-root");
    let _ = std::fs::remove_dir_all(&root);
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    let dpkg = |args: &[&str]| {
        let mut command = Command::new("dpkg");
        command.arg(format!("--root={}", root.display())).args(["--force-script-chrootless", "--log=/dev/null"]);
        command.args(args);
        command
    };
    run(dpkg(&["-i"]).arg(&deb));
    let installed = run(Command::new(root.join("usr/bin/virtprof")).arg("--version"));
    assert_eq!(installed, run(virtprof().arg("--version")));
    let pages: Vec<String> = std::fs::read_dir(root.join("usr/share/man/man1"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        pages.iter().any(|p| p == "virtprof.1.gz") && pages.iter().any(|p| p == "virtprof-serve.1.gz"),
        "{pages:?}"
    );
    if have("man") {
        let page = run(Command::new("man").arg("-l").arg(root.join("usr/share/man/man1/virtprof-serve.1.gz")));
        assert!(page.contains("--token-file"), "{page}");
    }
    for file in [
        "usr/share/bash-completion/completions/virtprof",
        "usr/share/zsh/vendor-completions/_virtprof",
        "usr/share/fish/vendor_completions.d/virtprof.fish",
        "etc/default/virtprof-serve",
        "usr/share/doc/virtprof/copyright",
        "usr/share/doc/virtprof/examples/prometheus/alerts.yml",
        "usr/share/doc/virtprof/examples/grafana/virtprof.json",
        "usr/share/doc/virtprof/examples/kubernetes/daemonset.yaml",
    ] {
        assert!(root.join(file).is_file(), "{file} not installed");
    }
    let unit = "lib/systemd/system/virtprof-serve.service";
    if have("systemd-analyze") && Path::new("/lib/systemd/system/sysinit.target").exists() {
        // The scratch root as a system with systemd: the host's targets beside the unit (the
        // unit's default dependencies name them), and its man pages where `Documentation=`
        // is looked up.
        let targets: Vec<PathBuf> = std::fs::read_dir("/lib/systemd/system")
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "target"))
            .collect();
        for target in &targets {
            std::fs::copy(target, root.join("lib/systemd/system").join(target.file_name().unwrap())).unwrap();
        }
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.display()))
            .arg(root.join(unit))
            .env("MANPATH", root.join("usr/share/man"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
        for target in &targets {
            std::fs::remove_file(root.join("lib/systemd/system").join(target.file_name().unwrap())).unwrap();
        }
    } else {
        note(test, "no systemd-analyze or systemd targets here: the unit is not verified");
    }
    run(&mut dpkg(&["--purge", "virtprof"]));
    let mut left = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.starts_with(root.join("var/lib/dpkg")) {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                left.push(path);
            }
        }
    }
    assert!(left.is_empty(), "purged, the package left {left:?}");
    let _ = std::fs::remove_dir_all(&root);
}

/// The capabilities the unit (and the DaemonSet) give serve are the ones it needs: with them
/// it sees the VM and counts in the kernel; without CAP_SYS_PTRACE it says it cannot see VMs.
/// Every metric the alerting rules use is one it serves.
#[test]
fn the_units_capabilities_are_what_serve_needs_and_the_rules_use_what_it_serves() {
    let test = "the_units_capabilities_are_what_serve_needs_and_the_rules_use_what_it_serves";
    if !have("setpriv") {
        note(test, "SKIP: no setpriv");
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let unit = std::fs::read_to_string(repo().join("packaging/virtprof-serve.service")).unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("the unit names its capabilities")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect();
    let bounding = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).unwrap();
    assert_eq!(bounding, unit.lines().find_map(|l| l.strip_prefix("AmbientCapabilities=")).unwrap());
    let daemonset = std::fs::read_to_string(repo().join("deploy/kubernetes/daemonset.yaml")).unwrap();
    let added = format!("add: [{}]", caps.iter().map(|c| c.to_uppercase()).collect::<Vec<_>>().join(", "));
    assert!(daemonset.contains(&added), "the DaemonSet adds what the unit has: {added}");

    let mut vm = virtprof()
        .args(["testvm", "-w", "pio-kernel", "--duration", "30s", "--name", "caps-vm"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let pid = vm.id().to_string();
    let with = |caps: &[String]| {
        let set = format!("-all{}", caps.iter().map(|c| format!(",+{c}")).collect::<String>());
        let wrapper = ["setpriv", &format!("--bounding-set={set}"), "--inh-caps=-all"];
        let served = Served::start_under(&wrapper, &["--max-age", "0", "-d", "20s"]);
        std::thread::sleep(Duration::from_millis(1500));
        let text = scrape(&served.address, "");
        served.stop();
        text
    };
    let text = with(&caps);
    let vm_pid: Vec<&str> = text.lines().filter(|l| l.starts_with("virtprof_vcpu_run_seconds_total{")).collect();
    assert!(vm_pid.iter().any(|l| l.contains("vm=\"caps-vm\"")), "with {caps:?} serve sees the VM:\n{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("virtprof_unavailable_info{")),
        "with {caps:?} nothing is missing:\n{text}"
    );
    let families: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).collect();
    let rules = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml")).unwrap();
    let used = regex::Regex::new(r"virtprof_[a-z_]+").unwrap();
    for metric in used.find_iter(&rules).map(|m| m.as_str()) {
        assert!(families.contains(&metric), "the rules use {metric}, which serve does not serve: {families:?}");
    }
    // The role names the starved-thread rule matches are serve's.
    let roles = text.lines().find(|l| l.starts_with("# HELP virtprof_vmm_thread_run_seconds")).unwrap();
    let matched = regex::Regex::new(r#"role=~"([^"]+)""#).unwrap();
    for role in matched.captures(&rules).expect("a rule on roles")[1].split('|') {
        assert!(roles.contains(role) || text.contains(&format!("role=\"{role}\"")), "role {role}: {roles}");
    }

    let without: Vec<String> = caps.iter().filter(|c| *c != "sys_ptrace").cloned().collect();
    let text = with(&without);
    assert!(
        text.lines().any(|l| l.starts_with("virtprof_unavailable_info{") && l.contains("CAP_SYS_PTRACE")),
        "without CAP_SYS_PTRACE serve says why it sees no VM:\n{text}"
    );
    assert!(!text.contains(&format!("pid=\"{pid}\"")), "{text}");
    let _ = vm.kill();
    let _ = vm.wait();
}

#[test]
fn the_alerting_rules_pass_their_tests_on_series_recorded_from_serve() {
    let test = "the_alerting_rules_pass_their_tests_on_series_recorded_from_serve";
    if !have("promtool") {
        note(test, "SKIP: no promtool (apt-get install prometheus)");
        return;
    }
    let dir = repo().join("deploy/prometheus");
    run(Command::new("promtool").args(["check", "rules"]).arg(dir.join("alerts.yml")));
    let said = run(Command::new("promtool").current_dir(&dir).args(["test", "rules", "alerts.test.yml"]));
    assert!(said.contains("SUCCESS"), "{said}");
    // The tests expect at least the alerts the recording was made to trip.
    let tests = std::fs::read_to_string(dir.join("alerts.test.yml")).unwrap();
    for alert in [
        "VcpuWaitingForCpu",
        "VmExitStorm",
        "VmmIoThreadStarved",
        "VmSlow",
        "VirtprofDown",
        "VirtprofLostEvents",
        "VmCpuTakenBy",
    ] {
        let section = tests.split("alertname: ").find(|s| s.starts_with(alert) && s.contains("exp_labels"));
        assert!(section.is_some(), "no firing case for {alert} in alerts.test.yml");
    }
    // A rule made wrong fails them.
    let broken = temp("alerts-broken");
    std::fs::create_dir_all(&broken).unwrap();
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    std::fs::write(broken.join("alerts.yml"), rules.replace("> 0.2", "> 0.9")).unwrap();
    std::fs::copy(dir.join("alerts.test.yml"), broken.join("alerts.test.yml")).unwrap();
    let out =
        Command::new("promtool").current_dir(&broken).args(["test", "rules", "alerts.test.yml"]).output().unwrap();
    assert!(!out.status.success(), "a threshold moved past the recorded waits still passes");
    let _ = std::fs::remove_dir_all(&broken);
}

#[test]
fn the_kubernetes_manifests_validate_against_their_schemas() {
    let test = "the_kubernetes_manifests_validate_against_their_schemas";
    let out = Command::new("bash").arg(repo().join("scripts/kubernetes/check.sh")).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => assert!(said.contains("Invalid: 0, Errors: 0, Skipped: 0"), "{said}"),
        Some(2) => note(test, format!("SKIP: {}", said.trim())),
        _ => panic!("scripts/kubernetes/check.sh: {said}"),
    }
}
