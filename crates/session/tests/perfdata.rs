//! A perf.data made on the development host (`perf record -e kvm:kvm_userspace_exit -e
//! kvm:kvm_pio -e sched:sched_switch -a` over `virtprof testvm -w pio-user --vcpus 2 -n 40`):
//! its samples decode with its own formats, its COMM records give each vCPU thread its
//! process, and with neither kvm_fpu nor kvm_entry recorded every userspace exit is counted
//! while no duration is claimed.

use std::path::Path;

use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions};
use virtprof_session::{DecoderNames, Session};

#[test]
fn perf_data_reads_with_its_own_formats_and_processes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pvm-pio-user-2x40.perf.data");
    let session = Session::open_any(&path, &Default::default()).unwrap();
    assert!(session.metadata.host.contains_key("perf_version"), "{:?}", session.metadata.host);
    // perf's COMM records name every thread with its process; the saved cmdlines add names
    // only. The run's two vCPU threads belong to one VMM process.
    let vcpus: Vec<_> =
        session.metadata.tasks.iter().filter(|t| t.comm.starts_with("vcpu") && t.pid != t.tid).collect();
    assert_eq!(vcpus.len(), 2, "{vcpus:?}");
    assert_eq!(vcpus[0].pid, vcpus[1].pid, "one VMM process: {vcpus:?}");
    let mut decoder = session.decoder(&["kvm", "sched"]).unwrap();
    let holdings = session.holdings(&decoder);
    use virtprof_model::evidence::Class;
    assert!(!holdings.has(Class::RoundTripEnd) && holdings.has(Class::UserspaceExit));
    let mut exits = ExitAnalyzer::new(ExitOptions { holdings, ..Default::default() });
    let walk = session.analyse(&mut decoder, &mut [&mut exits]).unwrap();
    let report = exits.finish(&DecoderNames(&decoder));
    // 40 iterations and testvm's 2 marker writes per vCPU.
    assert_eq!((report.totals.exits, report.totals.heavyweight), (84, Some(84)));
    assert!(report.by_reason.iter().all(|r| r.total_ns.is_none()), "no duration without an end event");
    assert!(report.source.unavailable.iter().any(|u| u.contains("kvm_fpu or kvm_entry were not recorded")));
    assert_eq!(session.loss(&walk).total(), 0);
}
