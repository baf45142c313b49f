//! A real Prometheus (Debian's `prometheus` package) scrapes `virtprof serve` every second
//! while test VMs run: PromQL over a minute agrees with `top --json` for the same minute, the
//! exposition passes `promtool check metrics`, and every query of the shipped Grafana
//! dashboard returns series.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::serve::{scrape, Served};
use super::util::{have_kvm, have_tracefs, note, temp, virtprof};

/// The window compared, seconds.
const WINDOW_S: u64 = 60;

struct Prometheus {
    child: Child,
    address: String,
    dir: PathBuf,
}

impl Prometheus {
    /// Prometheus scraping `target` every second, with its data in a fresh folder.
    fn start(target: &str) -> Prometheus {
        let dir = temp("prometheus");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: virtprof\n    static_configs:\n      - targets: [\"{target}\"]\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        // A port the kernel picks, handed on (Prometheus cannot report one it picked itself).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let address = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).unwrap())
            .spawn()
            .unwrap();
        Prometheus { child, address, dir }
    }

    /// An instant query at `at` (Unix seconds): its result vector.
    fn query(&self, promql: &str, at: f64) -> Vec<Value> {
        let out = Command::new("curl")
            .args(["-sfG", &format!("http://{}/api/v1/query", self.address)])
            .arg("--data-urlencode")
            .arg(format!("query={promql}"))
            .arg("--data-urlencode")
            .arg(format!("time={at}"))
            .output()
            .unwrap();
        assert!(out.status.success(), "query failed: {promql}\n{}", self.log());
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(reply["status"], "success", "{promql}: {reply}");
        reply["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The value of a query's series whose `vm` label is `vm`.
    fn value_for(&self, promql: &str, at: f64, vm: &str) -> f64 {
        let result = self.query(promql, at);
        let series = result
            .iter()
            .find(|s| s["metric"]["vm"] == vm)
            .unwrap_or_else(|| panic!("{promql}: no {vm} in {result:?}"));
        series["value"][1].as_str().unwrap().parse().unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn have(test: &str, program: &str) -> bool {
    let found =
        Command::new("sh").arg("-c").arg(format!("command -v {program}")).output().is_ok_and(|o| o.status.success());
    if !found {
        note(test, format!("SKIP: needs {program} (scripts/test.sh installs it)"));
    }
    found
}

/// Within `pct` percent of each other (relative to the larger).
fn close(a: f64, b: f64, pct: f64) -> bool {
    (a - b).abs() <= pct / 100.0 * a.abs().max(b.abs())
}

#[test]
fn prometheus_rates_over_a_minute_agree_with_top_and_the_dashboard_queries_return_series() {
    let test = "prometheus_rates_over_a_minute_agree_with_top_and_the_dashboard_queries_return_series";
    if !have(test, "prometheus") || !have(test, "promtool") || !have(test, "curl") {
        return;
    }
    let Some(_kvm) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    // Two VMs contending for CPU 1 (each runs about half the time and waits the rest), and
    // one whose vCPU blocks on I/O about a thousand times a second.
    let run_for = format!("{}s", WINDOW_S + 40);
    let vms: Vec<Child> = [
        vec!["-w", "compute", "--vms", "2", "--pin", "1", "--name", "prom-cpu"],
        vec!["-w", "io-bound", "--pin", "0", "--name", "prom-io"],
    ]
    .iter()
    .map(|args| {
        virtprof().arg("testvm").args(args).args(["--duration", &run_for]).stdout(Stdio::null()).spawn().unwrap()
    })
    .collect();
    let served = Served::start(&["-d", "200s"]);
    let prometheus = Prometheus::start(&served.address);
    let up = (0..60).any(|_| {
        std::thread::sleep(Duration::from_secs(1));
        let result = prometheus.query("up{job=\"virtprof\"}", now_s());
        result.first().is_some_and(|s| s["value"][1] == "1")
    });
    assert!(up, "Prometheus never scraped serve:\n{}", prometheus.log());

    // The exposition as promtool sees it.
    let text = scrape(&served.address, "");
    let mut lint = Command::new("promtool").args(["check", "metrics"]).stdin(Stdio::piped()).output_with(&text);
    lint.retain(|l| !l.is_empty());
    assert!(lint.is_empty(), "promtool check metrics: {lint:?}");

    // The same minute, seen by `top --json` and by PromQL at its end.
    let before = now_s();
    let top = virtprof().args(["top", "--once", "--json", "-d", &WINDOW_S.to_string()]).output().unwrap();
    let at = now_s();
    assert!(top.status.success(), "{}", String::from_utf8_lossy(&top.stderr));
    // Let Prometheus take the scrape that closes the window.
    std::thread::sleep(Duration::from_secs(2));
    let top: Value = serde_json::from_slice(&top.stdout).unwrap();
    let window = top["windows"].as_array().unwrap().iter().find(|w| w["label"] == "run").unwrap();
    let range = format!("{WINDOW_S}s");
    // top's window lies within [before, at]; PromQL's is the last minute before `at`, from
    // scrapes a second apart. They differ by at most `slack` seconds at each end (top's start
    // and exit on a loaded host, plus a scrape), so a share may differ by up to 2·slack/W of
    // the window besides rounding: what holds however busy the host is.
    let covered = window["seconds"].as_f64().unwrap();
    let slack = (at - before - covered).max(0.0) + 1.0;
    let tolerance = (200.0 * slack / WINDOW_S as f64).max(2.0);
    eprintln!("windows may differ by {slack:.1} s at each end: figures compared within {tolerance:.1} %");
    let share = |state: &str, vm: &str| {
        let rate = |s: &str| format!("sum by (vm) (rate(virtprof_vcpu_{s}_seconds_total[{range}]))");
        let promql = format!("100 * {} / ({} + {} + {})", rate(state), rate("run"), rate("wait"), rate("blocked"));
        prometheus.value_for(&promql, at, vm)
    };
    let mut compared = 0;
    for vm in window["vms"].as_array().unwrap() {
        let name = vm["name"].as_str().unwrap();
        if !name.starts_with("prom-") {
            continue;
        }
        for (state, key) in [("run", "running_pct"), ("wait", "waiting_pct"), ("blocked", "blocked_pct")] {
            let (promql, top) = (share(state, name), vm[key].as_f64().unwrap());
            eprintln!("{name} {state}: PromQL {promql:.2} % · top {top:.2} %");
            // Shares are compared in points of 100.
            assert!((promql - top).abs() <= tolerance, "{name} {state}: PromQL {promql:.2} % vs top {top:.2} %");
            compared += 1;
        }
        let exits = prometheus.value_for(&format!("sum by (vm) (rate(virtprof_vcpu_exits_total[{range}]))"), at, name);
        let top_exits = vm["exits_per_s"].as_f64().unwrap();
        eprintln!("{name} exits/s: PromQL {exits:.1} · top {top_exits:.1}");
        if name == "prom-io" {
            assert!(top_exits > 100.0, "the I/O VM exits often: {top_exits}/s");
        }
        assert!(
            close(exits, top_exits, tolerance) || (exits - top_exits).abs() < 1.0,
            "{name} exits/s: PromQL {exits:.1} vs top {top_exits:.1}"
        );
        compared += 1;
    }
    assert_eq!(compared, 3 * 4, "three VMs, four figures each");

    // Every query of the dashboard returns series (variables set to "all").
    let dashboard = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/virtprof.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(dashboard).unwrap()).unwrap();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let promql = expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$vm", ".*");
            let result = prometheus.query(&promql, at);
            assert!(!result.is_empty(), "panel '{}' query returns nothing: {promql}", panel["title"]);
            queries += 1;
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap().iter().filter(|v| v["type"] == "query") {
        let definition = variable["definition"].as_str().unwrap();
        // label_values(METRIC, LABEL): the metric must have series carrying that label.
        let inner = definition.trim_start_matches("label_values(").trim_end_matches(')');
        let (metric, label) = inner.rsplit_once(", ").unwrap();
        let result = prometheus.query(&metric.replace("$instance", ".*"), at);
        assert!(result.iter().any(|s| s["metric"][label].is_string()), "variable {definition}");
    }
    assert!(queries >= 15, "{queries} dashboard queries");
    served.stop();
    for mut vm in vms {
        let _ = vm.kill();
        let _ = vm.wait();
    }
}

/// `Command::output` with `input` on standard input; stdout and stderr lines.
trait OutputWith {
    fn output_with(&mut self, input: &str) -> Vec<String>;
}

impl OutputWith for Command {
    fn output_with(&mut self, input: &str) -> Vec<String> {
        use std::io::Write;
        let mut child = self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        text.lines().map(str::to_string).collect()
    }
}
