//! The system-call filter every judged program runs under, compiled to the
//! classic-BPF programs that bubblewrap loads (`--add-seccomp-fd`) just
//! before it starts the interpreter.
//!
//! The namespaces already take away the network, other processes and the
//! host's files; the filter closes what a process could still reach from
//! inside them: it cannot create a process (fork, vfork, or a `clone` that is
//! not a thread), open any socket, create namespaces or mounts, trace,
//! load kernel code (modules, BPF), use io_uring (whose operations bypass
//! this filter), or reach keyrings and other kernel interfaces a test never
//! needs. Everything else a Python interpreter uses is allowed, so ordinary
//! programs, threads included, run unchanged. Denied calls fail with `EPERM`
//! (the candidate sees a normal `PermissionError`), except `clone3`, which
//! fails with `ENOSYS` so that the C library falls back to `clone`, where the
//! thread flag can be checked (seccomp cannot read `clone3`'s arguments).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The x32 ABI's bit on a system-call number: the same architecture tag as
/// x86-64, so the same calls are denied under both numbers.
#[cfg(target_arch = "x86_64")]
const X32_BIT: i64 = 0x4000_0000;

/// Calls denied outright (besides `clone` without `CLONE_THREAD`).
fn denied() -> Vec<i64> {
    use libc::*;
    let mut calls = vec![
        // No network of any kind, not even Unix sockets.
        SYS_socket,
        SYS_socketpair,
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
    // Calls only the x86-64 table has (aarch64 makes processes with clone).
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

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<Vec<u8>, String> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch()?,
    )
    .map_err(|e| e.to_string())?;
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

/// The filters as raw BPF programs, in the order bubblewrap should load them:
/// the `EPERM` list (with `clone` denied unless it makes a thread), then
/// `clone3` as `ENOSYS`.
pub(super) fn programs() -> Result<Vec<Vec<u8>>, String> {
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for call in denied() {
        for nr in numbers(call) {
            deny.insert(nr, Vec::new());
        }
    }
    let not_a_thread = SeccompRule::new(vec![SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
        0,
    )
    .map_err(|e| e.to_string())?])
    .map_err(|e| e.to_string())?;
    for nr in numbers(libc::SYS_clone) {
        deny.insert(nr, vec![not_a_thread.clone()]);
    }
    let mut clone3: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in numbers(libc::SYS_clone3) {
        clone3.insert(nr, Vec::new());
    }
    Ok(vec![
        compile(deny, libc::EPERM)?,
        compile(clone3, libc::ENOSYS)?,
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
        // The deny list holds dozens of calls, each tested by at least one jump.
        assert!(programs[0].len() > programs[1].len());
    }
}
