# attack: call the raw clone/fork system call through ctypes
# expect: refused
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(57)  # fork on x86-64 (clone with SIGCHLD elsewhere)
if pid == 0:
    os._exit(0)
assert pid > 0, "fork refused, errno %d" % ctypes.get_errno()
