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

use crate::qos::{role_cells, vcpu_cells, vm_cells, COLUMNS};
use virtprof_engine::sampler::Snapshot;
use virtprof_model::vmm::ThreadRole;

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
    let guest_rows = u16::try_from(snapshot.guests.len()).unwrap_or(u16::MAX).min(area.height / 4);
    let [header, body, guests, keys] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(1),
        Constraint::Length(guest_rows),
        Constraint::Length(1),
    ])
    .areas(area);
    let guest_lines: Vec<Line> = snapshot.guests.iter().map(|g| Line::from(super::lines::guest(g))).collect();
    frame.render_widget(Paragraph::new(guest_lines), guests);
    let Some(window) = snapshot.windows.get(state.window) else { return };
    frame.render_widget(Paragraph::new(header_lines(snapshot, window, state, status)), header);
    if window.vms.is_empty() {
        let hint = "No VM on this host (no process holds a KVM VM fd, or none is readable: run as root).\n\
                    Start one with `virtprof testvm --duration 60s`, or try `virtprof demo`.";
        frame.render_widget(Paragraph::new(hint), body);
    } else {
        // The header takes a line; rows past the body's height would be cut off anyway.
        frame.render_widget(table(window, state, usize::from(body.height.saturating_sub(1))), body);
    }
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
        "virtprof top · {vms} VMs · window {} ({}) · CPU {cpu} · sort {} · exits from {} · lost events {}",
        window.label,
        window.length_text(1),
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
    let third = super::lines::energy(&snapshot.cores, snapshot.swaps_per_s, snapshot.balancer);
    vec![Line::from(first).bold(), Line::from(second), Line::from(third)]
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
        SortKey::Running => vm.running_pct.unwrap_or(-1.0),
        SortKey::Waiting => vm.waiting_pct.unwrap_or(-1.0),
        SortKey::Blocked => vm.blocked_pct.unwrap_or(-1.0),
        SortKey::Exits => vm.exits_per_s.unwrap_or(-1.0),
    };
    vms.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name)).then(a.pid.cmp(&b.pid)));
    vms
}

/// The table's first `max_rows` rows: with hundreds of VMs, formatting the rows no terminal
/// shows was most of a refresh's drawing.
fn table<'a>(window: &'a WindowReport, state: &ViewState, max_rows: usize) -> Table<'a> {
    let header = Row::new(COLUMNS).style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let mut rows = Vec::new();
    for vm in visible_vms(window, state) {
        if rows.len() >= max_rows {
            break;
        }
        rows.push(Row::new(vm_cells(vm)).style(Style::new().add_modifier(Modifier::BOLD)));
        if state.vcpu_rows {
            let room = max_rows.saturating_sub(rows.len());
            rows.extend(vm.vcpus.iter().take(room).map(|v| Row::new(vcpu_cells(v))));
            let room = max_rows.saturating_sub(rows.len());
            let outside = vm.roles.iter().filter(|r| r.role != ThreadRole::Vcpu).take(room);
            rows.extend(outside.map(|r| Row::new(role_cells(r)).style(Style::new().add_modifier(Modifier::ITALIC))));
        }
    }
    let widths = [28, 8, 4, 6, 6, 6, 7, 10, 11, 10, 23, 7, 8].map(Constraint::Length);
    Table::new(rows, widths.into_iter().chain([Constraint::Min(10)])).header(header).column_spacing(1)
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

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyEvent;
    use ratatui::Terminal;
    use virtprof_analysis::qos::{ReasonRate, RoleRow, VcpuRow};

    use super::*;

    fn snapshot() -> Snapshot {
        let vcpu = |index: u32, tid: u32, run: f64| VcpuRow {
            index,
            tid,
            cpu: Some(0),
            running_pct: Some(run),
            waiting_pct: Some(100.0 - run),
            blocked_pct: Some(0.0),
            unknown_pct: Some(0.0),
            run_ns: Some(0),
            wait_ns: Some(0),
            blocked_ns: Some(0),
            exec_count: Some(117),
            inferred_exec_count: Some(0),
            cpu_per_exec_us: Some(4057.1),
            wait_per_exec_us: Some(4346.3),
            blocked_per_io_us: Some(0.0),
            alloc_min_us: Some(717.0),
            alloc_avg_us: Some(4057.0),
            alloc_max_us: Some(7842.0),
            wait_max_us: Some(9120.0),
            io_count: Some(3),
            exits: Some(137),
            exits_per_s: Some(137.0),
            kvm_stats_exits_per_s: None,
            top_reasons: vec![ReasonRate { reason: "KVM_EXIT_IO".into(), per_s: 3.0 }],
        };
        let vm = |pid: u32, name: &str, run: f64| VmRow {
            pid,
            name: name.into(),
            kind: "virtprof-testvm".into(),
            owner: Default::default(),
            running_pct: Some(run),
            waiting_pct: Some(100.0 - run),
            blocked_pct: Some(0.0),
            exec_count: Some(117),
            io_count: Some(3),
            exits_per_s: Some(137.0),
            vcpus: vec![vcpu(0, pid + 1, run)],
            roles: vec![RoleRow {
                role: ThreadRole::MainLoop,
                threads: 1,
                cpus: Some(0.25),
                running_pct: Some(24.9),
                waiting_pct: Some(20.0),
                blocked_pct: Some(55.1),
                run_ns: Some(250_000_000),
                wait_ns: Some(200_000_000),
                blocked_ns: Some(551_000_000),
                exec_count: Some(7242),
                execs_per_s: Some(7242.0),
                cpu_per_exec_us: Some(34.5),
                wait_per_exec_us: Some(27.6),
                io_per_exec: None,
            }],
        };
        let window = |label: &str| WindowReport {
            seconds: Some(1.0),
            label: label.into(),
            start_ns: 0,
            end_ns: 1_000_000_000,
            cpu: None,
            exits_source: "kvm-stats".into(),
            vms: vec![vm(100, "contend-0", 48.3), vm(200, "contend-1", 51.7)],
            unavailable: Vec::new(),
        };
        let core = |cpu| virtprof_engine::energy::book::CoreRow { cpu, power_w: 9.5, total_j: 120.0, temp_c: 44.8 };
        Snapshot {
            mode: "trace",
            approximate: false,
            lost_events: 0,
            loss: None,
            windows: vec![window("1s"), window("10s")],
            cores: vec![core(0), core(1)],
            swaps_per_s: Some(9.5),
            balancer: None,
            guests: Vec::new(),
        }
    }

    fn screen(snapshot: &Snapshot, state: &ViewState, size: (u16, u16)) -> String {
        let mut terminal = Terminal::new(TestBackend::new(size.0, size.1)).unwrap();
        terminal.draw(|f| render(f, snapshot, state, "refresh 1.0 s")).unwrap();
        let buffer = terminal.backend().buffer();
        (0..size.1)
            .map(|y| (0..size.0).map(|x| buffer[(x, y)].symbol()).collect::<String>().trim_end().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_screen_shows_the_json_numbers() {
        let snap = snapshot();
        let text = screen(&snap, &ViewState::default(), (160, 12));
        let json = serde_json::to_value(&snap).unwrap();
        for vm in json["windows"][0]["vms"].as_array().unwrap() {
            let row = text.lines().find(|l| l.starts_with(vm["name"].as_str().unwrap())).expect("VM row");
            for key in ["running_pct", "waiting_pct"] {
                assert!(row.contains(&format!("{:.1}", vm[key].as_f64().unwrap())), "{key} in {row}");
            }
            assert!(row.contains(&vm["exec_count"].to_string()), "{row}");
        }
        assert!(text.contains(" vcpu0") && text.contains("KVM_EXIT_IO 3") && text.contains("4057"), "{text}");
        let main_loop = text.lines().find(|l| l.contains("main-loop ×1")).expect("a main-loop row");
        assert!(
            main_loop.contains("24.9")
                && main_loop.contains("7242")
                && main_loop.contains("0.25 CPUs")
                && main_loop.contains("io/exec -"),
            "{main_loop}"
        );
        assert!(text.contains("window 1s") && text.contains("exits from kvm-stats"), "{text}");
        assert!(text.contains("energy: cpu0 9.5 W 120 J 44.8 °C · cpu1") && text.contains("swaps/s 9.5"), "{text}");
    }

    #[test]
    fn keys_change_the_view() {
        let snap = snapshot();
        let mut state = ViewState::default();
        let press = |state: &mut ViewState, c: char| handle_key(state, KeyEvent::from(KeyCode::Char(c)), &[0, 1]);
        press(&mut state, 'v');
        assert!(!screen(&snap, &state, (160, 12)).contains(" vcpu0"));
        press(&mut state, 's'); // by run%: contend-1 first
        let text = screen(&snap, &state, (160, 12));
        assert!(text.find("contend-1").unwrap() < text.find("contend-0").unwrap(), "{text}");
        press(&mut state, 'f');
        for c in "end-0".chars() {
            press(&mut state, c);
        }
        handle_key(&mut state, KeyEvent::from(KeyCode::Enter), &[0, 1]);
        let text = screen(&snap, &state, (160, 12));
        assert!(text.contains("contend-0") && !text.contains("contend-1"), "{text}");
        press(&mut state, 'w');
        assert!(screen(&snap, &state, (160, 12)).contains("window 10s"));
        press(&mut state, 'c');
        assert_eq!(state.cpu, Some(0));
        press(&mut state, 'c');
        press(&mut state, 'c');
        assert_eq!(state.cpu, None);
        press(&mut state, '?');
        assert!(screen(&snap, &state, (160, 24)).contains(" help "));
        assert_eq!(press(&mut state, 'q'), Action::Redraw); // closes help first
        assert_eq!(press(&mut state, 'q'), Action::Quit);
    }

    #[test]
    fn no_vms_gets_a_hint() {
        let mut snap = snapshot();
        snap.windows.iter_mut().for_each(|w| w.vms.clear());
        assert!(screen(&snap, &ViewState::default(), (160, 12)).contains("virtprof demo"));
    }

    #[test]
    fn a_tiny_terminal_gets_a_message_not_a_panic() {
        let text = screen(&snapshot(), &ViewState::default(), (30, 4));
        assert!(text.contains("too small"), "{text}");
    }
}
