//! The system-call filters every judged program runs under, compiled to the
//! classic-BPF programs that bubblewrap loads (`--add-seccomp-fd`) just
//! before it starts the interpreter.
//!
//! The first filter is an allow list: only the calls a CPython interpreter
//! running a test needs (files inside the sandbox's view, memory, threads,
//! signals to itself, clocks, polling) pass; every other call answers
//! `ENOSYS`, as if the kernel did not have it, so the C library's fallbacks
//! still work and a call added to a future kernel is not reachable until it
//! is reviewed here. The second filter names the calls a program is most
//! likely to try on purpose and answers them `EPERM`, so the candidate sees
//! a normal `PermissionError`: new processes (fork, vfork, a `clone` that
//! is not a thread), sockets of every family, System V shared memory,
//! message queues and semaphores, POSIX message queues and `memfd_create`
//! (memory that outlives or escapes the address-space limit), namespaces
//! and mounts, tracing, kernel code, keyrings and io_uring. `clone3` is
//! absent from the allow list, so it answers `ENOSYS` and the C library
//! falls back to `clone`, whose flags seccomp can read. bubblewrap loads
//! the filters in order; where both answer with an error, the one loaded
//! last (the deny list) gives the errno.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The x32 ABI's bit on a system-call number: the same architecture tag as
/// x86-64, so the deny list covers both numbers (the allow list names only
/// the 64-bit numbers, so x32 calls are not allowed at all).
#[cfg(target_arch = "x86_64")]
const X32_BIT: i64 = 0x4000_0000;

/// Calls a Python test may make (besides `clone` for a thread).
// long-fn: a flat allow list read as one reviewed table, grouped by purpose.
fn allowed() -> Vec<i64> {
    use libc::*;
    let mut calls = vec![
        // Files and descriptors, inside the read-only view and the /tmp tmpfs.
        SYS_read,
        SYS_write,
        SYS_readv,
        SYS_writev,
        SYS_pread64,
        SYS_pwrite64,
        SYS_preadv,
        SYS_pwritev,
        SYS_preadv2,
        SYS_pwritev2,
        SYS_openat,
        SYS_close,
        SYS_close_range,
        SYS_fstat,
        SYS_newfstatat,
        SYS_statx,
        SYS_statfs,
        SYS_fstatfs,
        SYS_lseek,
        SYS_ioctl,
        SYS_fcntl,
        SYS_flock,
        SYS_fsync,
        SYS_fdatasync,
        SYS_truncate,
        SYS_ftruncate,
        SYS_fallocate,
        SYS_fadvise64,
        SYS_getdents64,
        SYS_getcwd,
        SYS_chdir,
        SYS_fchdir,
        SYS_renameat,
        SYS_renameat2,
        SYS_mkdirat,
        SYS_unlinkat,
        SYS_symlinkat,
        SYS_linkat,
        SYS_readlinkat,
        SYS_fchmod,
        SYS_fchmodat,
        SYS_fchownat,
        SYS_fchown,
        SYS_utimensat,
        SYS_faccessat,
        SYS_faccessat2,
        SYS_umask,
        SYS_getxattr,
        SYS_lgetxattr,
        SYS_fgetxattr,
        SYS_listxattr,
        SYS_llistxattr,
        SYS_flistxattr,
        SYS_dup,
        SYS_dup3,
        SYS_pipe2,
        SYS_sendfile,
        SYS_copy_file_range,
        SYS_splice,
        SYS_tee,
        // Waiting on descriptors and events.
        SYS_ppoll,
        SYS_pselect6,
        SYS_epoll_create1,
        SYS_epoll_ctl,
        SYS_epoll_pwait,
        SYS_eventfd2,
        SYS_timerfd_create,
        SYS_timerfd_settime,
        SYS_timerfd_gettime,
        // Memory (mapped memory counts against RLIMIT_AS).
        SYS_mmap,
        SYS_mprotect,
        SYS_munmap,
        SYS_brk,
        SYS_mremap,
        SYS_msync,
        SYS_mincore,
        SYS_madvise,
        SYS_membarrier,
        // Threads and their synchronisation.
        SYS_futex,
        SYS_set_tid_address,
        SYS_set_robust_list,
        SYS_get_robust_list,
        SYS_rseq,
        SYS_sched_yield,
        SYS_sched_getaffinity,
        SYS_sched_setaffinity,
        SYS_sched_getparam,
        SYS_sched_getscheduler,
        SYS_sched_get_priority_max,
        SYS_sched_get_priority_min,
        SYS_getpriority,
        SYS_setpriority,
        SYS_prctl,
        SYS_capget,
        // Signals: only this PID namespace's processes can be reached.
        SYS_rt_sigaction,
        SYS_rt_sigprocmask,
        SYS_rt_sigreturn,
        SYS_rt_sigpending,
        SYS_rt_sigtimedwait,
        SYS_rt_sigsuspend,
        SYS_rt_sigqueueinfo,
        SYS_rt_tgsigqueueinfo,
        SYS_sigaltstack,
        SYS_kill,
        SYS_tgkill,
        SYS_tkill,
        SYS_restart_syscall,
        // Clocks, timers, sleeping.
        SYS_clock_gettime,
        SYS_clock_getres,
        SYS_clock_nanosleep,
        SYS_nanosleep,
        SYS_gettimeofday,
        SYS_getitimer,
        SYS_setitimer,
        SYS_timer_create,
        SYS_timer_settime,
        SYS_timer_gettime,
        SYS_timer_getoverrun,
        SYS_timer_delete,
        // Identity and limits (read; limits can only be lowered).
        SYS_getpid,
        SYS_gettid,
        SYS_getppid,
        SYS_getuid,
        SYS_geteuid,
        SYS_getgid,
        SYS_getegid,
        SYS_getresuid,
        SYS_getresgid,
        SYS_getgroups,
        SYS_getpgid,
        SYS_getsid,
        SYS_setpgid,
        SYS_getrlimit,
        SYS_setrlimit,
        SYS_prlimit64,
        SYS_getrusage,
        SYS_sysinfo,
        SYS_times,
        SYS_uname,
        SYS_getrandom,
        SYS_getcpu,
        // The interpreter's start (bubblewrap execs it under the filter) and end.
        SYS_execve,
        SYS_execveat,
        SYS_exit,
        SYS_exit_group,
        SYS_wait4,
        SYS_waitid,
    ];
    // Calls only the x86-64 table has (aarch64 uses the *at forms).
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        SYS_open,
        SYS_creat,
        SYS_stat,
        SYS_lstat,
        SYS_access,
        SYS_pipe,
        SYS_dup2,
        SYS_select,
        SYS_poll,
        SYS_epoll_create,
        SYS_epoll_wait,
        SYS_eventfd,
        SYS_alarm,
        SYS_pause,
        SYS_time,
        SYS_getpgrp,
        SYS_getdents,
        SYS_rename,
        SYS_mkdir,
        SYS_rmdir,
        SYS_unlink,
        SYS_link,
        SYS_symlink,
        SYS_readlink,
        SYS_chmod,
        SYS_chown,
        SYS_lchown,
        SYS_utime,
        SYS_utimes,
        SYS_futimesat,
        SYS_arch_prctl,
    ]);
    calls
}

/// Calls refused with `EPERM` (besides `clone` without `CLONE_THREAD`):
/// none is on the allow list; naming them gives the candidate a clear
/// `PermissionError` instead of `ENOSYS`.
fn denied() -> Vec<i64> {
    use libc::*;
    let mut calls = vec![
        // No network of any kind, not even Unix sockets.
        SYS_socket,
        SYS_socketpair,
        // No memory outside the address-space limit: System V shared memory,
        // message queues and semaphores, POSIX queues, memory files.
        SYS_shmget,
        SYS_shmat,
        SYS_shmctl,
        SYS_shmdt,
        SYS_msgget,
        SYS_msgsnd,
        SYS_msgrcv,
        SYS_msgctl,
        SYS_semget,
        SYS_semop,
        SYS_semtimedop,
        SYS_semctl,
        SYS_mq_open,
        SYS_mq_unlink,
        SYS_mq_timedsend,
        SYS_mq_timedreceive,
        SYS_mq_notify,
        SYS_mq_getsetattr,
        SYS_memfd_create,
        SYS_memfd_secret,
        // No namespaces, mounts or root changes.
        SYS_unshare,
        SYS_setns,
        SYS_mount,
        SYS_umount2,
        SYS_pivot_root,
        SYS_chroot,
        SYS_open_tree,
        SYS_move_mount,
        SYS_fsopen,
        SYS_fsconfig,
        SYS_fsmount,
        SYS_fspick,
        SYS_mount_setattr,
        // No reading or writing other processes.
        SYS_ptrace,
        SYS_process_vm_readv,
        SYS_process_vm_writev,
        SYS_kcmp,
        SYS_pidfd_getfd,
        // No kernel code or kernel-side state.
        SYS_init_module,
        SYS_finit_module,
        SYS_delete_module,
        SYS_kexec_load,
        SYS_kexec_file_load,
        SYS_bpf,
        SYS_perf_event_open,
        SYS_keyctl,
        SYS_add_key,
        SYS_request_key,
        SYS_userfaultfd,
        SYS_io_uring_setup,
        SYS_io_uring_enter,
        SYS_io_uring_register,
        SYS_fanotify_init,
        SYS_open_by_handle_at,
        SYS_name_to_handle_at,
        SYS_mknodat,
        SYS_swapon,
        SYS_swapoff,
        SYS_reboot,
        SYS_syslog,
        SYS_acct,
        SYS_quotactl,
        SYS_personality,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([SYS_fork, SYS_vfork, SYS_mknod, SYS_iopl, SYS_ioperm]);
    calls
}

/// The architecture the filter checks for (a call made under another ABI
/// is not filtered by number, so only these two are supported).
fn arch() -> Result<TargetArch, String> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else {
        Err(format!("no filter for {}", std::env::consts::ARCH))
    }
}

/// Every number a call is known by on this architecture.
fn numbers(call: i64) -> Vec<i64> {
    #[cfg(target_arch = "x86_64")]
    return vec![call, call | X32_BIT];
    #[cfg(not(target_arch = "x86_64"))]
    vec![call]
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<Vec<u8>, String> {
    let filter =
        SeccompFilter::new(rules, mismatch, matched, arch()?).map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for op in program {
        bytes.extend_from_slice(&op.code.to_ne_bytes());
        bytes.push(op.jt);
        bytes.push(op.jf);
        bytes.extend_from_slice(&op.k.to_ne_bytes());
    }
    Ok(bytes)
}

/// `clone`'s first argument has (or lacks) `CLONE_THREAD`.
fn clone_thread(is_thread: bool) -> Result<SeccompRule, String> {
    let flag = libc::CLONE_THREAD as u64;
    SeccompRule::new(vec![SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(flag),
        if is_thread { flag } else { 0 },
    )
    .map_err(|e| e.to_string())?])
    .map_err(|e| e.to_string())
}

/// The filters as raw BPF programs, in the order bubblewrap should load
/// them: the allow list (everything else `ENOSYS`; `clone` only for a
/// thread), then the deny list (`EPERM`; `clone` unless it makes a thread).
pub(super) fn programs() -> Result<Vec<Vec<u8>>, String> {
    let mut allow: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for call in allowed() {
        allow.insert(call, Vec::new());
    }
    allow.insert(libc::SYS_clone, vec![clone_thread(true)?]);
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for call in denied() {
        for nr in numbers(call) {
            deny.insert(nr, Vec::new());
        }
    }
    for nr in numbers(libc::SYS_clone) {
        deny.insert(nr, vec![clone_thread(false)?]);
    }
    Ok(vec![
        compile(
            allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            SeccompAction::Allow,
        )?,
        compile(
            deny,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
        )?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_filters_compile_to_whole_instructions() {
        let programs = programs().expect("filters compile");
        assert_eq!(programs.len(), 2);
        for p in &programs {
            assert!(!p.is_empty() && p.len() % 8 == 0, "{} bytes", p.len());
        }
    }

    #[test]
    fn no_call_is_both_allowed_and_denied() {
        let allowed = allowed();
        let both: Vec<i64> = denied()
            .into_iter()
            .filter(|c| allowed.contains(c))
            .collect();
        assert!(both.is_empty(), "{both:?}");
        for call in [libc::SYS_memfd_create, libc::SYS_shmget, libc::SYS_clone3] {
            assert!(!allowed.contains(&call), "{call} must not be allowed");
        }
    }
}
