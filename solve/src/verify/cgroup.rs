//! A control group per sandboxed process, where this machine lets the judge
//! make one: `memory` caps what `RLIMIT_AS` cannot see (tmpfs files and
//! their inodes, pipe buffers, kernel memory a process makes the kernel
//! hold), `pids` caps threads, and `cpu` holds the process to one core.
//!
//! The unified hierarchy (cgroup v2) is used when it offers the `memory` and
//! `pids` controllers and the judge may enable them below its own group;
//! otherwise the legacy per-controller hierarchies (cgroup v1, as on hybrid
//! hosts) when their directories are writable. Where neither is writable
//! (an unprivileged user without a delegated group), [`Cgroups::detect`]
//! says why and the sandbox runs on resource limits and the system-call
//! filter alone (docs/SECURITY.md says what holds then).
//!
//! Each group is a fresh directory under one `tern-judge` parent; the child
//! joins it between fork and exec (writing `0` to `cgroup.procs`, before any
//! code of the candidate runs), and the group is emptied and removed when
//! its process has been reaped.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Most processes and threads one sandbox may hold (bubblewrap's two, the
/// interpreter and its threads).
pub(super) const PIDS_MAX: u64 = 64;
/// CPU period and quota: one core.
const CPU_PERIOD_US: u64 = 100_000;
/// The parent directory's name in each hierarchy.
const PARENT: &str = "tern-judge";

/// Which cgroup layout the judge uses.
#[derive(Debug)]
enum Layout {
    /// cgroup v2: one parent with `memory`, `pids` (and `cpu` when offered)
    /// enabled for its children.
    Unified { parent: PathBuf, cpu: bool },
    /// cgroup v1: one parent per hierarchy.
    Legacy {
        memory: PathBuf,
        pids: PathBuf,
        cpu: Option<PathBuf>,
    },
}

/// Where the judge makes its groups.
#[derive(Debug)]
pub(super) struct Cgroups {
    layout: Layout,
    next: AtomicU64,
}

/// One sandbox's group (one directory per hierarchy), removed on drop.
#[derive(Debug)]
pub(super) struct Group {
    dirs: Vec<PathBuf>,
    procs: Vec<File>,
}

impl Cgroups {
    /// The layout this machine offers, or why none can be used.
    pub(super) fn detect() -> Result<Cgroups, String> {
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let unified = unified(&mounts, &own);
        let layout = match unified {
            Ok(layout) => layout,
            Err(v2) => legacy(&mounts, &own).map_err(|v1| format!("{v2}; {v1}"))?,
        };
        Ok(Cgroups {
            layout,
            next: AtomicU64::new(0),
        })
    }

    /// Which layout is in use, in words (for reports).
    pub(super) fn describe(&self) -> String {
        match &self.layout {
            Layout::Unified { parent, cpu } => format!(
                "cgroup v2 under {} (memory, pids{})",
                parent.display(),
                if *cpu { ", cpu" } else { "" }
            ),
            Layout::Legacy { memory, cpu, .. } => format!(
                "cgroup v1 under {} (memory, pids{})",
                memory.display(),
                if cpu.is_some() { ", cpu" } else { "" }
            ),
        }
    }

    /// A fresh group capped at `memory_bytes` of memory (no swap),
    /// [`PIDS_MAX`] tasks and one core.
    pub(super) fn create(&self, memory_bytes: u64) -> io::Result<Group> {
        let name = format!(
            "{}-{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let mut group = Group {
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        let mut make = |parent: &Path| -> io::Result<PathBuf> {
            let dir = parent.join(&name);
            fs::create_dir(&dir)?;
            group.dirs.push(dir.clone());
            Ok(dir)
        };
        match &self.layout {
            Layout::Unified { parent, cpu } => {
                let dir = make(parent)?;
                write(&dir.join("memory.max"), &memory_bytes.to_string())?;
                // Absent where the kernel has no swap accounting: nothing to cap.
                let _ = write(&dir.join("memory.swap.max"), "0");
                write(&dir.join("pids.max"), &PIDS_MAX.to_string())?;
                if *cpu {
                    write(
                        &dir.join("cpu.max"),
                        &format!("{CPU_PERIOD_US} {CPU_PERIOD_US}"),
                    )?;
                }
            }
            Layout::Legacy { memory, pids, cpu } => {
                let dir = make(memory)?;
                write(
                    &dir.join("memory.limit_in_bytes"),
                    &memory_bytes.to_string(),
                )?;
                let _ = write(
                    &dir.join("memory.memsw.limit_in_bytes"),
                    &memory_bytes.to_string(),
                );
                let dir = make(pids)?;
                write(&dir.join("pids.max"), &PIDS_MAX.to_string())?;
                if let Some(cpu) = cpu {
                    let dir = make(cpu)?;
                    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    write(&dir.join("cpu.cfs_quota_us"), &CPU_PERIOD_US.to_string())?;
                }
            }
        }
        for dir in &group.dirs {
            // Close-on-exec (std's default): the sandbox never holds it.
            let procs = OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))?;
            group.procs.push(procs);
        }
        Ok(group)
    }
}

impl Group {
    /// The `cgroup.procs` descriptors the child writes `0` to before exec.
    pub(super) fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Whether the memory cap was reached (the kernel killed a task of the
    /// group for it), read before the group is removed.
    pub(super) fn out_of_memory(&self) -> bool {
        let Some(dir) = self.dirs.first() else {
            return false;
        };
        if let Ok(events) = fs::read_to_string(dir.join("memory.events")) {
            return events
                .lines()
                .any(|l| l.starts_with("oom_kill ") && !l.ends_with(" 0"));
        }
        fs::read_to_string(dir.join("memory.oom_control"))
            .map(|s| {
                s.lines()
                    .any(|l| l.starts_with("oom_kill ") && !l.ends_with(" 0"))
            })
            .unwrap_or(false)
    }
}

impl Drop for Group {
    /// Kills whatever is left in the group, then removes its directories
    /// (retrying briefly while the kernel finishes tearing tasks down).
    fn drop(&mut self) {
        self.procs.clear();
        for dir in self.dirs.iter().rev() {
            for attempt in 0..100 {
                if let Ok(pids) = fs::read_to_string(dir.join("cgroup.procs")) {
                    for pid in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                        // SAFETY: kill(2) on a pid read from the group's own list.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(if attempt < 10 { 1 } else { 5 }))
                    }
                }
            }
        }
    }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.write_all(value.as_bytes())
}

/// `(mount point, mount root, super options)` of each mount of `fstype`.
fn mounts_of<'a>(mountinfo: &'a str, fstype: &str) -> Vec<(&'a str, &'a str, &'a str)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut right = right.split(' ');
            if right.next()? != fstype {
                return None;
            }
            let options = right.nth(1).unwrap_or("");
            let fields: Vec<&str> = left.split(' ').collect();
            Some((*fields.get(4)?, *fields.get(3)?, options))
        })
        .collect()
}

/// This process's own group in a hierarchy, below that hierarchy's mount.
fn own_dir(mount: &str, root: &str, path: &str) -> PathBuf {
    let relative = path.strip_prefix(root).unwrap_or(path);
    Path::new(mount).join(relative.trim_start_matches('/'))
}

fn unified(mountinfo: &str, own: &str) -> Result<Layout, String> {
    let (mount, root, _) = *mounts_of(mountinfo, "cgroup2")
        .first()
        .ok_or("no cgroup v2 hierarchy is mounted")?;
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("this process has no cgroup v2 group")?;
    let here = own_dir(mount, root, path);
    let offered = fs::read_to_string(here.join("cgroup.controllers")).unwrap_or_default();
    let offered: Vec<&str> = offered.split_whitespace().collect();
    if !(offered.contains(&"memory") && offered.contains(&"pids")) {
        return Err(format!(
            "cgroup v2 at {} does not offer the memory and pids controllers",
            here.display()
        ));
    }
    let cpu = offered.contains(&"cpu");
    let wanted = if cpu {
        "+memory +pids +cpu"
    } else {
        "+memory +pids"
    };
    let parent = here.join(PARENT);
    let enable = |dir: &Path| write(&dir.join("cgroup.subtree_control"), wanted);
    // A group with processes cannot enable controllers for children (the
    // "no internal processes" rule), so a judge in a non-root group first
    // moves itself into a leaf beside the judge's parent.
    if enable(&here).is_err() {
        let leaf = here.join("tern-server");
        let _ = fs::create_dir(&leaf);
        write(&leaf.join("cgroup.procs"), &std::process::id().to_string())
            .and_then(|()| enable(&here))
            .map_err(|e| {
                format!(
                    "cannot enable the memory and pids controllers under {}: {e}",
                    here.display()
                )
            })?;
    }
    if let Err(e) = fs::create_dir(&parent) {
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(format!("cannot create {}: {e}", parent.display()));
        }
    }
    enable(&parent).map_err(|e| {
        format!(
            "cannot enable the memory and pids controllers under {}: {e}",
            parent.display()
        )
    })?;
    Ok(Layout::Unified { parent, cpu })
}

fn legacy(mountinfo: &str, own: &str) -> Result<Layout, String> {
    let v1 = mounts_of(mountinfo, "cgroup");
    let parent_for = |controller: &str| -> Result<PathBuf, String> {
        let (mount, root, _) = *v1
            .iter()
            .find(|(_, _, options)| options.split(',').any(|o| o == controller))
            .ok_or_else(|| format!("no cgroup v1 `{controller}` hierarchy is mounted"))?;
        let path = own
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == controller)
                    .then_some(path)
            })
            .unwrap_or("/");
        let parent = own_dir(mount, root, path).join(PARENT);
        match fs::create_dir(&parent) {
            Ok(()) => Ok(parent),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(parent),
            Err(e) => Err(format!(
                "cannot create {} (cgroup v1 `{controller}`): {e}",
                parent.display()
            )),
        }
    };
    Ok(Layout::Legacy {
        memory: parent_for("memory")?,
        pids: parent_for("pids")?,
        cpu: parent_for("cpu").ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
35 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    #[test]
    fn mounts_are_found_by_type_and_controller() {
        let v1 = mounts_of(MOUNTINFO, "cgroup");
        assert_eq!(v1.len(), 2);
        assert_eq!(v1[1], ("/sys/fs/cgroup/cpu,cpuacct", "/", "rw,cpu,cpuacct"));
        assert_eq!(
            mounts_of(MOUNTINFO, "cgroup2"),
            vec![("/sys/fs/cgroup/unified", "/", "rw")]
        );
        assert_eq!(
            own_dir("/sys/fs/cgroup/memory", "/", "/a/b"),
            PathBuf::from("/sys/fs/cgroup/memory/a/b")
        );
        // A container whose mount root is its own group.
        assert_eq!(
            own_dir("/sys/fs/cgroup", "/docker/x", "/docker/x/y"),
            PathBuf::from("/sys/fs/cgroup/y")
        );
    }
}
