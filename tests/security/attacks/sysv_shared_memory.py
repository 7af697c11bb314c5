# attack: hold 512 MiB of System V shared memory, outside the address-space limit
# expect: refused
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 512 * 1024 * 1024
shmid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)
assert shmid >= 0, "shmget refused, errno %d" % ctypes.get_errno()
address = libc.shmat(shmid, None, 0)
assert address not in (None, ctypes.c_void_p(-1).value), "shmat refused"
for offset in range(0, size, 4096):
    ctypes.c_char.from_address(address + offset).value = b"x"
