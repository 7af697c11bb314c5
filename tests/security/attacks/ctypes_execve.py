# attack: call libc execve() through ctypes to run a shell
# expect: refused
# expect-reason: execve refused
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
argv = (ctypes.c_char_p * 4)(b"/bin/sh", b"-c", b"exit 0", None)
libc.execve(b"/bin/sh", argv, None)
raise AssertionError("execve refused, errno %d" % ctypes.get_errno())
