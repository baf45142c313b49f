//! Who owns a VM: its UUID from the VMM's command line, and from the VMM's cgroup path the
//! libvirt domain, Kubernetes pod and container that run it. Fleet tools key VMs by these
//! (libvirt exporters by domain, KubeVirt by its virt-launcher pod), so `serve` labels with
//! them and recordings keep them.
//!
//! Cgroup paths name their owners by convention, not by contract; the layouts read here are
//! those of systemd's and cgroupfs's drivers:
//! - libvirt: `machine.slice/machine-qemu\x2d3\x2dweb.scope` (systemd escapes `-` as `\x2d`),
//!   or `machine/qemu-3-web.libvirt-qemu`;
//! - Kubernetes: `kubepods-burstable-pod<uid with _>.slice` or `kubepods/burstable/pod<uid>`;
//! - containers: `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or a
//!   64-hex-digit folder under a pod.

use std::path::Path;

use virtprof_model::units::printable;
use virtprof_model::vmm::{VmOwner, VmmKind};

/// The owner of VMM `pid` (a VM of `kind` started with `argv`), read under `proc_root`.
pub fn owner(proc_root: &Path, pid: u32, kind: VmmKind, argv: &[String]) -> VmOwner {
    let cgroup = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok();
    owner_of(kind, argv, cgroup.as_deref())
}

/// [`owner`] from the command line and the text of `/proc/PID/cgroup`.
pub fn owner_of(kind: VmmKind, argv: &[String], cgroup_file: Option<&str>) -> VmOwner {
    let cgroup = cgroup_file.and_then(cgroup_path);
    let segments: Vec<String> = cgroup.iter().flat_map(|p| p.split('/')).map(unescape_systemd).collect();
    let clean = |s: String| printable(&s).into_owned();
    VmOwner {
        uuid: uuid(kind, argv).map(clean),
        libvirt_domain: segments.iter().find_map(|s| libvirt_domain(s)).map(clean),
        pod_uid: segments.iter().find_map(|s| pod_uid(s)).map(clean),
        container_id: segments.iter().find_map(|s| container_id(s)).map(clean),
        cgroup: cgroup.filter(|p| p != "/").map(clean),
    }
}

/// QEMU `-uuid U`, cloud-hypervisor `--platform ...,uuid=U`.
fn uuid(kind: VmmKind, argv: &[String]) -> Option<String> {
    let after = |flag: &str| argv.iter().position(|a| a == flag).and_then(|i| argv.get(i + 1));
    match kind {
        VmmKind::Qemu => after("-uuid").or_else(|| after("--uuid")).cloned(),
        VmmKind::CloudHypervisor => {
            after("--platform")?.split(',').find_map(|kv| kv.strip_prefix("uuid=")).map(str::to_string)
        }
        _ => None,
    }
    .filter(|u| !u.is_empty())
}

/// The unified (v2) hierarchy's path, else v1's systemd one, else the first listed.
fn cgroup_path(file: &str) -> Option<String> {
    let entries: Vec<(&str, &str)> = file
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
        .collect();
    let pick = |want: &str| entries.iter().find(|(c, _)| *c == want).map(|(_, p)| p.to_string());
    pick("").or_else(|| pick("name=systemd")).or_else(|| entries.first().map(|(_, p)| p.to_string()))
}

/// systemd's unit-name escaping undone: `\x2d` → `-`.
fn unescape_systemd(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 2..i + 4).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], bytes.get(i + 1), hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'\\', Some(b'x'), Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `machine-qemu-3-web.scope` or `qemu-3-web.libvirt-qemu` → `web`.
fn libvirt_domain(segment: &str) -> Option<String> {
    let unit = segment.strip_prefix("machine-").unwrap_or(segment);
    let rest = unit.strip_suffix(".scope").or_else(|| unit.strip_suffix(".libvirt-qemu"))?;
    let rest = rest.strip_prefix("qemu-")?;
    let (id, name) = rest.split_once('-')?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty()).then(|| name.to_string())
}

/// `kubepods-burstable-pod1b2c_..._9.slice` or `pod1b2c-...-9` → the pod's UID.
fn pod_uid(segment: &str) -> Option<String> {
    let at = segment.rfind("pod")?;
    if at > 0 && !segment[..at].ends_with('-') {
        return None;
    }
    let uid = segment[at + 3..].strip_suffix(".slice").unwrap_or(&segment[at + 3..]).replace('_', "-");
    let is_uid = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    is_uid.then_some(uid)
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or a bare 64-hex id.
fn container_id(segment: &str) -> Option<String> {
    let id = ["cri-containerd-", "crio-", "docker-", "libpod-"]
        .iter()
        .find_map(|p| segment.strip_prefix(p))
        .map(|rest| rest.strip_suffix(".scope").unwrap_or(rest))
        .unwrap_or(segment);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn a_libvirt_guest_on_systemd_has_its_domain_and_uuid() {
        let argv = args(
            "/usr/bin/qemu-system-x86_64 -name guest=web-1,debug-threads=on -uuid 5f3c9d1e-8a7b-4c2d-9e0f-1a2b3c4d5e6f",
        );
        let cgroup = "0::/machine.slice/machine-qemu\\x2d3\\x2dweb\\x2d1.scope/libvirt/emulator\n";
        let owner = owner_of(VmmKind::Qemu, &argv, Some(cgroup));
        assert_eq!(owner.uuid.as_deref(), Some("5f3c9d1e-8a7b-4c2d-9e0f-1a2b3c4d5e6f"));
        assert_eq!(owner.libvirt_domain.as_deref(), Some("web-1"));
        assert_eq!(owner.pod_uid, None);
        assert_eq!(
            owner.cgroup.as_deref(),
            Some("/machine.slice/machine-qemu\\x2d3\\x2dweb\\x2d1.scope/libvirt/emulator")
        );
    }

    #[test]
    fn a_libvirt_guest_on_cgroupfs_v1_has_its_domain() {
        let cgroup =
            "12:cpu,cpuacct:/machine/qemu-7-db.libvirt-qemu/emulator\n1:name=systemd:/machine/qemu-7-db.libvirt-qemu\n";
        let owner = owner_of(VmmKind::Qemu, &args("qemu-system-x86_64"), Some(cgroup));
        assert_eq!(owner.libvirt_domain.as_deref(), Some("db"));
        assert_eq!(owner.cgroup.as_deref(), Some("/machine/qemu-7-db.libvirt-qemu"));
    }

    #[test]
    fn a_kubevirt_launcher_has_its_pod_and_container() {
        let id = "a".repeat(64);
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0d5b7c1e_2f3a_4b5c_8d9e_0f1a2b3c4d5e.slice/cri-containerd-{id}.scope\n"
        );
        let owner = owner_of(VmmKind::Qemu, &args("qemu-kvm"), Some(&systemd));
        assert_eq!(owner.pod_uid.as_deref(), Some("0d5b7c1e-2f3a-4b5c-8d9e-0f1a2b3c4d5e"));
        assert_eq!(owner.container_id.as_deref(), Some(id.as_str()));
        let cgroupfs = format!("0::/kubepods/besteffort/pod0d5b7c1e-2f3a-4b5c-8d9e-0f1a2b3c4d5e/{id}\n");
        let owner = owner_of(VmmKind::Qemu, &args("qemu-kvm"), Some(&cgroupfs));
        assert_eq!(owner.pod_uid.as_deref(), Some("0d5b7c1e-2f3a-4b5c-8d9e-0f1a2b3c4d5e"));
        assert_eq!(owner.container_id.as_deref(), Some(id.as_str()));
    }

    #[test]
    fn a_plain_process_has_nothing_but_its_cgroup() {
        let owner =
            owner_of(VmmKind::Firecracker, &args("firecracker --id fc1"), Some("0::/user.slice/session-4.scope\n"));
        assert_eq!(owner, VmOwner { cgroup: Some("/user.slice/session-4.scope".into()), ..Default::default() });
        assert!(owner_of(VmmKind::VirtprofTestvm, &[], None).is_empty());
        assert!(owner_of(VmmKind::Qemu, &[], Some("0::/\n")).is_empty());
    }

    #[test]
    fn cloud_hypervisor_gives_its_platform_uuid_and_control_bytes_are_escaped() {
        let argv = args("cloud-hypervisor --platform num_pci_segments=1,uuid=1234");
        assert_eq!(owner_of(VmmKind::CloudHypervisor, &argv, None).uuid.as_deref(), Some("1234"));
        let argv = vec!["qemu".to_string(), "-uuid".to_string(), "x\x1b[31m".to_string()];
        assert!(!owner_of(VmmKind::Qemu, &argv, None).uuid.unwrap().contains('\x1b'));
    }
}
