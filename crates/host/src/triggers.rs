//! Event triggers and synthetic events in tracefs, taken out again. A tracefs instance whose
//! events carry hist triggers cannot be removed (rmdir says EBUSY), and a synthetic event
//! cannot be deleted while a trigger uses it; a trigger whose variables another trigger reads
//! cannot be removed before that one. So whoever cleans up after a run (the run itself, the
//! reaper after a kill, `doctor --cleanup`) takes the triggers out dependents first, then the
//! instance, then the synthetic events.

use std::io::Write;
use std::path::Path;

/// Append `text` to a tracefs control file. Appending matters: opening `synthetic_events`
/// with O_TRUNC deletes every synthetic event on the host, other tools' too.
pub fn append(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
    file.write_all(text.as_bytes())
}

/// The triggers a `trigger` file lists, as the commands that would add them again (the
/// kernel's listing ends each with its state, ` [active]` or ` [paused]`).
pub fn listed_triggers(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end().trim_end_matches(" [active]").trim_end_matches(" [paused]").to_string())
        .collect()
}

/// Remove every trigger of every event of the tracefs instance at `instance`. A trigger still
/// read by another is refused until that one is gone, so passes repeat while they make
/// progress. Returns how many triggers are left (0: the instance can be removed).
pub fn clear_instance_triggers(instance: &Path) -> usize {
    let files = trigger_files(instance);
    let mut left = usize::MAX;
    for _ in 0..8 {
        let mut now = 0;
        for file in &files {
            let Ok(listing) = std::fs::read_to_string(file) else { continue };
            for trigger in listed_triggers(&listing) {
                if append(file, &format!("!{trigger}")).is_err() {
                    now += 1;
                }
            }
        }
        if now == 0 || now >= left {
            return now;
        }
        left = now;
    }
    left
}

/// Every event's `trigger` file under `instance/events`.
fn trigger_files(instance: &Path) -> Vec<std::path::PathBuf> {
    let systems = std::fs::read_dir(instance.join("events")).into_iter().flatten().filter_map(Result::ok);
    systems
        .filter(|s| s.path().is_dir())
        .flat_map(|s| std::fs::read_dir(s.path()).into_iter().flatten().filter_map(Result::ok))
        .map(|e| e.path().join("trigger"))
        .filter(|t| t.is_file())
        .collect()
}

/// Delete the synthetic event `name` (tracefs root `root`). Not there is not an error.
pub fn remove_synthetic_event(root: &Path, name: &str) -> std::io::Result<()> {
    let listing = std::fs::read_to_string(root.join("synthetic_events"))?;
    if !synthetic_event_names(&listing).any(|n| n == name) {
        return Ok(());
    }
    append(&root.join("synthetic_events"), &format!("!{name}"))
}

/// The names a `synthetic_events` listing holds (`name<TAB>fields` per line).
pub fn synthetic_event_names(listing: &str) -> impl Iterator<Item = &str> {
    listing.lines().filter_map(|l| l.split_whitespace().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_triggers_are_given_back_as_commands_without_their_state() {
        let listing = "# Available triggers:\n# traceon traceoff\nhist:keys=common_pid:vals=hitcount:sort=hitcount:size=8192:clock=mono [active]\nhist:keys=reason:vals=hitcount [paused]\n\n";
        assert_eq!(
            listed_triggers(listing),
            ["hist:keys=common_pid:vals=hitcount:sort=hitcount:size=8192:clock=mono", "hist:keys=reason:vals=hitcount"]
        );
        assert!(listed_triggers("# Available triggers:\n").is_empty());
        let events = "virtprof_exit_12\tunsigned int reason; u32 isa; u64 lat\nwakeup_latency\tu64 lat; pid_t pid\n";
        assert_eq!(synthetic_event_names(events).collect::<Vec<_>>(), ["virtprof_exit_12", "wakeup_latency"]);
    }
}
