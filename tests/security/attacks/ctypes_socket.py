# attack: call libc socket() directly through ctypes
# expect: refused
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)
assert fd >= 0, "socket() refused, errno %d" % ctypes.get_errno()
