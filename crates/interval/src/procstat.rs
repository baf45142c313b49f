//! `/proc/stat` per-CPU times (user, nice, system, idle, iowait, irq, softirq, steal), read by
//! `pread` on a file kept open so a sample costs one syscall and no allocation.

use virtprof_host::procfs::ProcFile;

/// Columns of a `cpuN` line, in the kernel's order.
pub const FIELDS: [&str; 8] = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"];

/// An open `/proc/stat`.
#[derive(Debug)]
pub struct ProcStat {
    file: ProcFile,
    ns_per_tick: f64,
}

impl ProcStat {
    /// Open `/proc/stat`.
    pub fn open() -> std::io::Result<Self> {
        let hz = virtprof_host::procfs::clock_ticks_per_second();
        Ok(ProcStat { file: ProcFile::open("/proc/stat")?, ns_per_tick: 1e9 / hz })
    }

    /// The CPUs listed now.
    pub fn cpus(&mut self) -> std::io::Result<Vec<u32>> {
        let mut cpus = Vec::new();
        self.read(|cpu, _| cpus.push(cpu))?;
        Ok(cpus)
    }

    /// Every `cpuN` line as (N, its [`FIELDS`] in ns).
    pub fn read(&mut self, mut each: impl FnMut(u32, [f64; 8])) -> std::io::Result<()> {
        let ns_per_tick = self.ns_per_tick;
        parse(self.file.read_bytes()?, ns_per_tick, &mut each);
        Ok(())
    }
}

fn parse(text: &[u8], ns_per_tick: f64, each: &mut impl FnMut(u32, [f64; 8])) {
    for line in text.split(|&b| b == b'\n') {
        // `cpuN ...` lines; the `cpu  ...` total has a space where N would be.
        let Some(rest) = line.strip_prefix(b"cpu").filter(|r| r.first().is_some_and(u8::is_ascii_digit)) else {
            continue;
        };
        let mut words = rest.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let Some(cpu) = words.next().and_then(number) else { continue };
        let mut values = [0.0; 8];
        for v in &mut values {
            *v = words.next().and_then(number).unwrap_or(0) as f64 * ns_per_tick;
        }
        each(u32::try_from(cpu).unwrap_or(u32::MAX), values);
    }
}

fn number(word: &[u8]) -> Option<u64> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_per_cpu_lines_and_skips_the_total() {
        let text = b"cpu  10 0 5 100 0 0 0 0 0 0\ncpu0 4 0 2 50 1 0 3 7 0 0\ncpu1 6 0 3 50 0 0 0 0 0 0\nintr 1\n";
        let mut got = Vec::new();
        parse(text, 10e6, &mut |cpu, v| got.push((cpu, v[0], v[7])));
        assert_eq!(got, vec![(0, 40e6, 70e6), (1, 60e6, 0.0)]);
    }

    #[test]
    fn reads_this_host() {
        let mut stat = ProcStat::open().unwrap();
        assert!(!stat.cpus().unwrap().is_empty());
    }
}
