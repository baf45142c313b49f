//! `top`'s screen: a header, the VM/vCPU table of the selected window, a key line, and a help
//! overlay. Pure rendering of a [`Snapshot`] plus the UI state, so it is tested on ratatui's
//! `TestBackend`.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph, Row, Table};
use ratatui::Frame;
use virtprof_analysis::qos::{VmRow, WindowReport};

use super::sampler::Snapshot;

/// Smallest usable terminal.
const MIN_SIZE: (u16, u16) = (60, 6);

/// What the table is sorted by (descending, except names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// VM name.
    Name,
    /// Running share.
    Running,
    /// Waiting share.
    Waiting,
    /// Blocked share.
    Blocked,
    /// Exits per second.
    Exits,
}

impl SortKey {
    fn next(self) -> SortKey {
        match self {
            SortKey::Name => SortKey::Running,
            SortKey::Running => SortKey::Waiting,
            SortKey::Waiting => SortKey::Blocked,
            SortKey::Blocked => SortKey::Exits,
            SortKey::Exits => SortKey::Name,
        }
    }

    fn label(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::Running => "run%",
            SortKey::Waiting => "wait%",
            SortKey::Blocked => "blk%",
            SortKey::Exits => "exits/s",
        }
    }
}

/// The UI state the keys change.
#[derive(Debug, Clone)]
pub struct ViewState {
    /// Index into the snapshot's windows: 0 = last 1 s, 1 = last 10 s.
    pub window: usize,
    /// Only time on this physical CPU.
    pub cpu: Option<u32>,
    /// Sort order.
    pub sort: SortKey,
    /// Show VMs whose name contains this (case-insensitive), or whose pid is this.
    pub filter: String,
    /// Typing a filter.
    pub editing_filter: bool,
    /// Show vCPU rows under each VM.
    pub vcpu_rows: bool,
    /// Display frozen.
    pub paused: bool,
    /// Help overlay shown.
    pub help: bool,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState {
            window: 0,
            cpu: None,
            sort: SortKey::Name,
            filter: String::new(),
            editing_filter: false,
            vcpu_rows: true,
            paused: false,
            help: false,
        }
    }
}

/// What a key asks of the main loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Leave.
    Quit,
    /// Redraw with the new state.
    Redraw,
    /// Nothing changed.
    None,
}

/// Apply `key` to `state`; `cpus` are the physical CPUs `c` cycles through.
pub fn handle_key(state: &mut ViewState, key: KeyEvent, cpus: &[u32]) -> Action {
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Action::Quit;
    }
    if state.editing_filter {
        match key.code {
            KeyCode::Enter => state.editing_filter = false,
            KeyCode::Esc => {
                state.editing_filter = false;
                state.filter.clear();
            }
            KeyCode::Backspace => {
                state.filter.pop();
            }
            KeyCode::Char(c) => state.filter.push(c),
            _ => return Action::None,
        }
        return Action::Redraw;
    }
    match key.code {
        KeyCode::Char('q') | KeyCode::Esc if !state.help => return Action::Quit,
        KeyCode::Char('q') | KeyCode::Esc | KeyCode::Char('?') if state.help => state.help = false,
        KeyCode::Char('?') | KeyCode::Char('h') => state.help = true,
        KeyCode::Char('c') => {
            state.cpu = match state.cpu {
                None => cpus.first().copied(),
                Some(c) => cpus.iter().copied().find(|&x| x > c),
            }
        }
        KeyCode::Char('s') => state.sort = state.sort.next(),
        KeyCode::Char('f') => {
            state.editing_filter = true;
            state.filter.clear();
        }
        KeyCode::Char('v') => state.vcpu_rows = !state.vcpu_rows,
        KeyCode::Char('w') => state.window = 1 - state.window.min(1),
        KeyCode::Char('p') => state.paused = !state.paused,
        _ => return Action::None,
    }
    Action::Redraw
}

/// Draw the whole screen.
pub fn render(frame: &mut Frame, snapshot: &Snapshot, state: &ViewState, status: &str) {
    let area = frame.area();
    if area.width < MIN_SIZE.0 || area.height < MIN_SIZE.1 {
        let msg = format!(
            "terminal too small ({}x{}): virtprof top needs at least {}x{}; enlarge it or use --once",
            area.width, area.height, MIN_SIZE.0, MIN_SIZE.1
        );
        frame.render_widget(Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }), area);
        return;
    }
    let [header, body, keys] =
        Layout::vertical([Constraint::Length(2), Constraint::Min(1), Constraint::Length(1)]).areas(area);
    let Some(window) = snapshot.windows.get(state.window) else { return };
    frame.render_widget(Paragraph::new(header_lines(snapshot, window, state, status)), header);
    frame.render_widget(table(window, state), body);
    let key_line = if state.editing_filter {
        format!("filter: {}_   (Enter apply, Esc clear)", state.filter)
    } else {
        "q quit  c cpu  s sort  f filter  v vcpus  w window  p pause  ? help".to_string()
    };
    frame.render_widget(Paragraph::new(key_line).style(Style::new().add_modifier(Modifier::REVERSED)), keys);
    if state.help {
        help(frame, area);
    }
}

fn header_lines<'a>(snapshot: &Snapshot, window: &WindowReport, state: &ViewState, status: &str) -> Vec<Line<'a>> {
    let vms = visible_vms(window, state).len();
    let cpu = state.cpu.map_or_else(|| "all".to_string(), |c| c.to_string());
    let mut first = format!(
        "virtprof top · {vms} VMs · window {} ({:.1} s) · CPU {cpu} · sort {} · exits from {} · lost events {}",
        window.label,
        window.seconds,
        state.sort.label(),
        window.exits_source,
        snapshot.lost_events
    );
    if state.paused {
        first.push_str(" · PAUSED");
    }
    let second = if snapshot.approximate {
        format!("{status} · mode {} (approximate: blocked = remainder, no allocation/IO/reasons)", snapshot.mode)
    } else {
        format!("{status} · mode {}", snapshot.mode)
    };
    vec![Line::from(first).bold(), Line::from(second)]
}

/// The VMs that pass the filter, sorted.
pub fn visible_vms<'a>(window: &'a WindowReport, state: &ViewState) -> Vec<&'a VmRow> {
    let needle = state.filter.to_lowercase();
    let mut vms: Vec<&VmRow> = window
        .vms
        .iter()
        .filter(|vm| needle.is_empty() || vm.name.to_lowercase().contains(&needle) || vm.pid.to_string() == needle)
        .collect();
    let key = |vm: &VmRow| match state.sort {
        SortKey::Name => 0.0,
        SortKey::Running => vm.running_pct,
        SortKey::Waiting => vm.waiting_pct,
        SortKey::Blocked => vm.blocked_pct,
        SortKey::Exits => vm.exits_per_s,
    };
    vms.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name)).then(a.pid.cmp(&b.pid)));
    vms
}

fn table<'a>(window: &'a WindowReport, state: &ViewState) -> Table<'a> {
    let header = Row::new([
        "VM / VCPU",
        "PID/TID",
        "CPU",
        "RUN%",
        "WAIT%",
        "BLK%",
        "EXECS",
        "CPU/EX us",
        "WAIT/EX us",
        "BLK/IO us",
        "ALLOC us",
        "IO",
        "EXITS/s",
        "TOP EXIT REASONS /s",
    ])
    .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let mut rows = Vec::new();
    for vm in visible_vms(window, state) {
        rows.push(
            Row::new([
                vm.name.clone(),
                vm.pid.to_string(),
                vm.kind.clone(),
                format!("{:.1}", vm.running_pct),
                format!("{:.1}", vm.waiting_pct),
                format!("{:.1}", vm.blocked_pct),
                vm.exec_count.to_string(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                vm.io_count.to_string(),
                format!("{:.0}", vm.exits_per_s),
                String::new(),
            ])
            .style(Style::new().add_modifier(Modifier::BOLD)),
        );
        if !state.vcpu_rows {
            continue;
        }
        for v in &vm.vcpus {
            rows.push(Row::new([
                format!(" vcpu{}", v.index),
                v.tid.to_string(),
                v.cpu.map(|c| c.to_string()).unwrap_or_default(),
                format!("{:.1}", v.running_pct),
                format!("{:.1}", v.waiting_pct),
                format!("{:.1}", v.blocked_pct),
                v.exec_count.to_string(),
                format!("{:.0}", v.cpu_per_exec_us),
                format!("{:.0}", v.wait_per_exec_us),
                if v.io_count > 0 { format!("{:.0}", v.blocked_per_io_us) } else { "-".into() },
                v.alloc_avg_us.map_or_else(|| "-".into(), |a| format!("{a:.0}")),
                v.io_count.to_string(),
                format!("{:.0}", v.exits_per_s),
                v.top_reasons.iter().map(|r| format!("{} {:.0}", r.reason, r.per_s)).collect::<Vec<_>>().join(", "),
            ]));
        }
    }
    let widths = [
        Constraint::Length(18),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Min(10),
    ];
    Table::new(rows, widths).header(header).column_spacing(1)
}

fn help(frame: &mut Frame, area: Rect) {
    let text = [
        "virtprof top: scheduling QoS of KVM VMs (XenMon for KVM)",
        "",
        "RUN%   on a CPU          WAIT%  runnable, waiting (host-side steal)",
        "BLK%   sleeping (I/O, halt, timers)   EXECS  dispatches",
        "CPU/EX, WAIT/EX  per dispatch   BLK/IO  blocked time per I/O access",
        "ALLOC  mean length of executions ended by preemption",
        "IO     port + MMIO accesses   EXITS/s  VM exits (KVM stats fd when readable)",
        "",
        "q quit   c cycle physical CPU view   s cycle sort   f filter by name/pid",
        "v VM rows only / with vCPUs   w 1 s / 10 s window   p pause   ? close help",
    ];
    let width = 76.min(area.width);
    let height = u16::try_from(text.len()).unwrap_or(u16::MAX).saturating_add(2).min(area.height);
    let popup = Rect::new(area.x + (area.width - width) / 2, area.y + (area.height - height) / 2, width, height);
    frame.render_widget(Clear, popup);
    frame.render_widget(Paragraph::new(text.map(Line::from).to_vec()).block(Block::bordered().title(" help ")), popup);
}
