//! The coordinator's load: a server process per run (this binary's `serve` mode), the
//! two versions alternating, each loaded the same way, and their figures side by side.
//!
//! A run: `connections` TCP connections share the members (member `m` on connection
//! `m % connections`); every member joins (each group's barrier opens when its last
//! member joins); then every live member heartbeats once per `members / rate` seconds,
//! on an open schedule (a connection sends what is due each millisecond, answers or
//! not), while one member in `dead_every` never heartbeats, so its session expires.
//! After `warm` seconds, a window of `secs` seconds is measured: each heartbeat's round
//! trip (from the write of its batch to its answer), the server process's CPU time and
//! thread count; then the server's own record of its expiries (how late each session
//! was answered after its deadline) and of heartbeats it refused.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::protocol::{self, Stats, ANSWER_LEN, HEARTBEAT, JOIN, NONE, STATS};
use crate::load::latency_summary::{ms, LatencySummary};
use crate::load::process_usage;

/// Which sessions a server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// [`super::on_purgatory`].
    Purgatory,
    /// [`super::on_delay_queue`].
    DelayQueue,
}

impl Version {
    /// The name on the command line and in the results.
    pub fn name(self) -> &'static str {
        match self {
            Version::Purgatory => "purgatory",
            Version::DelayQueue => "delay-queue",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Version> {
        match name {
            "purgatory" => Some(Version::Purgatory),
            "delay-queue" => Some(Version::DelayQueue),
            _ => None,
        }
    }
}

/// How a run loads its server.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// The coordinator's shape.
    pub config: super::Config,
    /// Heartbeats per second, over all live members.
    pub rate: f64,
    /// TCP connections.
    pub connections: u32,
    /// One member in this many never heartbeats (0: none).
    pub dead_every: u32,
    /// Heartbeats before the measured window.
    pub warm: Duration,
    /// The measured window.
    pub secs: Duration,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The server's sessions.
    pub version: Version,
    /// Heartbeat round trips answered in the window.
    pub heartbeats: LatencySummary,
    /// Server CPU time per second of the window.
    pub cpu_per_sec: f64,
    /// The server process's threads at the window's end.
    pub threads: usize,
    /// The server's record (expiries, lateness, refused heartbeats).
    pub stats: Stats,
    /// Members whose sessions should have expired.
    pub dead: u64,
    /// Joins not answered `NONE`.
    pub join_errors: u64,
    /// Heartbeats of live members not answered `NONE`.
    pub heartbeat_errors: u64,
}

/// A server process of this binary (`serve` mode), stopped when its stdin closes.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(version: Version, load: &Load) -> std::io::Result<Server> {
        let exe = std::env::current_exe()?;
        let c = load.config;
        let mut child = Command::new(exe)
            .args([
                "serve",
                "--sessions",
                version.name(),
                "--members",
                &c.members.to_string(),
                "--group-size",
                &c.group_size.to_string(),
                "--session-timeout-ms",
                &c.session_timeout.as_millis().to_string(),
                "--rebalance-timeout-ms",
                &c.rebalance_timeout.as_millis().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            return Err(std::io::Error::other(format!(
                "the server said {line:?}, not its address"
            )));
        };
        Ok(Server {
            addr: addr.to_owned(),
            child,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes its stdin and waits up to 10 s for it to exit (then kills it).
    fn stop(mut self) -> std::io::Result<()> {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.flush();
        }
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.kill()?;
        self.child.wait()?;
        Err(std::io::Error::other("the server did not stop within 10 s"))
    }
}

/// What a run's connections share.
struct Tally {
    epoch: Instant,
    /// When each member's last heartbeat was written, ns after `epoch`.
    sent_at: Vec<AtomicU64>,
    joins_ok: AtomicU64,
    join_errors: AtomicU64,
    heartbeat_errors: AtomicU64,
    answered: AtomicU64,
    /// The window, ns after `epoch` (`u64::MAX` until set).
    window: [AtomicU64; 2],
    samples: Mutex<Vec<Duration>>,
    stop: AtomicBool,
}

impl Tally {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Runs one load against a fresh server of `version`, printing a progress line a second.
pub fn run(version: Version, load: &Load, label: &str) -> std::io::Result<RunResult> {
    let server = Server::start(version, load)?;
    let pid = server.pid();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(drive(version, load, &server.addr, pid, label));
    drop(runtime);
    server.stop()?;
    result
}

async fn drive(
    version: Version,
    load: &Load,
    addr: &str,
    pid: u32,
    label: &str,
) -> std::io::Result<RunResult> {
    let members = load.config.members;
    let tally = Arc::new(Tally {
        epoch: Instant::now(),
        sent_at: (0..members).map(|_| AtomicU64::new(0)).collect(),
        joins_ok: AtomicU64::new(0),
        join_errors: AtomicU64::new(0),
        heartbeat_errors: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        window: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
        samples: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    });
    let dead = |m: u32| load.dead_every > 0 && m.is_multiple_of(load.dead_every);
    let live_total = (0..members).filter(|&m| !dead(m)).count().max(1);
    let interval = live_total as f64 / load.rate;
    let start = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for c in 0..load.connections {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        tasks.push(tokio::spawn(read_answers(reader, Arc::clone(&tally))));
        let all: Vec<u32> = (c..members).step_by(load.connections as usize).collect();
        let live: Vec<u32> = all.iter().copied().filter(|&m| !dead(m)).collect();
        // Spread the connections' schedules over one send interval.
        let offset = interval * f64::from(c) / f64::from(load.connections) / live.len().max(1) as f64;
        tasks.push(tokio::spawn(write_requests(
            writer,
            all,
            live,
            interval,
            offset,
            Arc::clone(&tally),
            Arc::clone(&start),
        )));
    }
    // Every member joins; the groups' barriers open as their last members join.
    let joined_by = Instant::now() + load.config.rebalance_timeout + Duration::from_secs(10);
    while tally.joins_ok.load(Ordering::Relaxed) + tally.join_errors.load(Ordering::Relaxed)
        < u64::from(members)
    {
        if Instant::now() > joined_by {
            return Err(std::io::Error::other("joins unanswered"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.notify_waiters();
    tokio::time::sleep(load.warm).await;
    let cpu_before = process_usage::read(pid)?.cpu;
    let window_start = Instant::now();
    tally.window[0].store(tally.now(), Ordering::Relaxed);
    let answered_before = tally.answered.load(Ordering::Relaxed);
    let secs = load.secs.as_secs().max(1);
    for second in 1..=secs {
        tokio::time::sleep_until((window_start + Duration::from_secs(second)).into()).await;
        let answered = tally.answered.load(Ordering::Relaxed) - answered_before;
        println!(
            "  {label} {}: {second}/{secs} s, {answered} heartbeats answered",
            version.name()
        );
    }
    tally.window[1].store(tally.now(), Ordering::Relaxed);
    let window = window_start.elapsed();
    let cpu_after = process_usage::read(pid)?.cpu;
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))?.count();
    tally.stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = ask_stats(addr).await?;
    for task in tasks {
        task.abort();
    }
    let mut samples = std::mem::take(&mut *tally.samples.lock());
    let heartbeats = LatencySummary::of(&mut samples)
        .ok_or_else(|| std::io::Error::other("no heartbeat answered in the window"))?;
    Ok(RunResult {
        version,
        heartbeats,
        cpu_per_sec: (cpu_after - cpu_before).as_secs_f64() / window.as_secs_f64(),
        threads,
        stats,
        dead: (0..members).filter(|&m| dead(m)).count() as u64,
        join_errors: tally.join_errors.load(Ordering::Relaxed),
        heartbeat_errors: tally.heartbeat_errors.load(Ordering::Relaxed),
    })
}

/// Writes every member's join, then, once told to start, the live members' heartbeats
/// on schedule until the run stops.
async fn write_requests(
    mut writer: tokio::net::tcp::OwnedWriteHalf,
    all: Vec<u32>,
    live: Vec<u32>,
    interval: f64,
    offset: f64,
    tally: Arc<Tally>,
    start: Arc<tokio::sync::Notify>,
) {
    let started = start.notified();
    tokio::pin!(started);
    started.as_mut().enable();
    let mut bytes: Vec<u8> = all
        .iter()
        .flat_map(|&m| protocol::request(JOIN, m))
        .collect();
    if writer.write_all(&bytes).await.is_err() {
        return;
    }
    started.await;
    if live.is_empty() {
        return;
    }
    let t0 = Instant::now();
    let per_second = live.len() as f64 / interval;
    let mut sent: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !tally.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let elapsed = t0.elapsed().as_secs_f64() - offset;
        if elapsed < 0.0 {
            continue;
        }
        let due = (elapsed * per_second) as u64;
        if due <= sent {
            continue;
        }
        bytes.clear();
        let now = tally.now();
        for i in sent..due {
            let m = live[(i % live.len() as u64) as usize];
            tally.sent_at[m as usize].store(now, Ordering::Relaxed);
            bytes.extend_from_slice(&protocol::request(HEARTBEAT, m));
        }
        sent = due;
        if writer.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// Reads answers, counting joins and recording heartbeats' round trips in the window.
async fn read_answers(reader: tokio::net::tcp::OwnedReadHalf, tally: Arc<Tally>) {
    let mut reader = tokio::io::BufReader::with_capacity(64 * 1024, reader);
    let mut frame = [0u8; ANSWER_LEN];
    let mut local = Vec::new();
    while reader.read_exact(&mut frame).await.is_ok() {
        let (kind, member, error) = protocol::read_answer(&frame);
        match kind {
            JOIN if error == NONE => {
                tally.joins_ok.fetch_add(1, Ordering::Relaxed);
            }
            JOIN => {
                tally.join_errors.fetch_add(1, Ordering::Relaxed);
            }
            HEARTBEAT => {
                if error != NONE {
                    tally.heartbeat_errors.fetch_add(1, Ordering::Relaxed);
                }
                let now = tally.now();
                let sent = tally.sent_at[member as usize].load(Ordering::Relaxed);
                let window = (
                    tally.window[0].load(Ordering::Relaxed),
                    tally.window[1].load(Ordering::Relaxed),
                );
                if sent >= window.0 && sent < window.1 {
                    tally.answered.fetch_add(1, Ordering::Relaxed);
                    local.push(Duration::from_nanos(now.saturating_sub(sent)));
                    if local.len() >= 4096 {
                        tally.samples.lock().append(&mut local);
                    }
                }
            }
            _ => break,
        }
    }
    tally.samples.lock().append(&mut local);
}

/// The server's record, asked on a connection of its own.
async fn ask_stats(addr: &str) -> std::io::Result<Stats> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(&protocol::request(STATS, 0)).await?;
    let mut frame = [0u8; protocol::STATS_LEN];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut frame))
        .await
        .map_err(|_| std::io::Error::other("no stats answer"))??;
    if frame[0] != STATS {
        return Err(std::io::Error::other("not a stats answer"));
    }
    Ok(protocol::read_stats(frame[1..].try_into().expect("32 bytes")))
}

/// One line of a run's figures.
pub fn describe(r: &RunResult) -> String {
    format!(
        "{}: heartbeats {} p50 {} p99 {} max {}; server CPU {:.3} s/s, {} threads; expired {}/{} (late p99 {}, max {}); refused heartbeats {}, join errors {}",
        r.version.name(),
        r.heartbeats.count,
        ms(r.heartbeats.p50),
        ms(r.heartbeats.p99),
        ms(r.heartbeats.max),
        r.cpu_per_sec,
        r.threads,
        r.stats.expired,
        r.dead,
        ms(Duration::from_micros(r.stats.late_p99_us)),
        ms(Duration::from_micros(r.stats.late_max_us)),
        r.heartbeat_errors,
        r.join_errors,
    )
}

/// The median of `values` (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
