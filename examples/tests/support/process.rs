//! The `broker` binary as a child process of the test, for what must be measured apart
//! from the test's own memory or seen from outside (what it prints, how it exits).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use purgatory_examples::load::process_usage;

use super::LIMIT;

/// Starts the broker binary with `flags` on free loopback ports, its stderr to `stderr`;
/// returns it and the lines it prints on stdout, as they come.
fn spawn(flags: &[&str], stderr: Stdio) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_broker"))
        .args(["--listen", "127.0.0.1:0", "--followers", "0"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("the broker binary starts");
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, lines)
}

/// A broker child process, killed on drop.
pub struct BrokerProcess {
    child: Child,
    pub addr: SocketAddr,
    /// The lines it prints after the first, as they come.
    lines: mpsc::Receiver<String>,
}

impl BrokerProcess {
    pub fn start(flags: &[&str]) -> BrokerProcess {
        let (child, lines) = spawn(flags, Stdio::null());
        let mut broker = BrokerProcess {
            child,
            addr: "127.0.0.1:0".parse().unwrap(),
            lines,
        };
        let first = broker.next_line();
        let addr = first
            .strip_prefix("broker listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        broker.addr = addr.parse().unwrap();
        broker
    }

    pub fn next_line(&self) -> String {
        self.lines
            .recv_timeout(LIMIT)
            .expect("the broker printed nothing in time")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn rss_mib(&self) -> u64 {
        process_usage::read(self.child.id()).unwrap().rss_kib / 1024
    }

    /// Whether it exits within `within`.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let started = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if started.elapsed() >= within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Sends SIGINT and returns the rest of what it prints until it exits.
    pub fn interrupt(mut self) -> String {
        let pid = libc::pid_t::try_from(self.pid()).unwrap();
        // SAFETY: kill only sends a signal to our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        let mut out = String::new();
        let deadline = Instant::now() + LIMIT;
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            out.push_str(&line);
            out.push('\n');
        }
        let started = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(started.elapsed() < LIMIT, "the broker did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
        out
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The broker binary, killed when the test ends however it ends.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the broker binary with `flags` on free loopback ports; returns it, the lines it
/// prints on stdout, and its stderr.
pub fn start_binary(
    flags: &[&str],
) -> (Running, mpsc::Receiver<String>, std::process::ChildStderr) {
    let (mut child, printed) = spawn(flags, Stdio::piped());
    let stderr = child.stderr.take().unwrap();
    (Running(child), printed, stderr)
}

/// The address after `prefix` in the first printed line that has it.
pub fn printed_address(printed: &mpsc::Receiver<String>, prefix: &str) -> SocketAddr {
    let deadline = Instant::now() + LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = printed.recv_timeout(left).expect("the broker prints it");
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.split(['/', ' ']).next().unwrap().parse().unwrap();
        }
    }
}

/// The resident memory of process `pid`, in bytes (Linux).
pub fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib * 1024
}
