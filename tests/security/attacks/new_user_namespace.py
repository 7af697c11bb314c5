# attack: create a user namespace to regain capabilities
# expect: refused
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
assert libc.unshare(CLONE_NEWUSER) == 0, "unshare refused, errno %d" % ctypes.get_errno()
