# attack: hold 320 MiB in memfd files, outside the address-space limit
# expect: refused
import os
held = []
for _ in range(5):
    fd = os.memfd_create("hold")
    os.ftruncate(fd, 64 * 1024 * 1024)
    chunk = b"x" * (1024 * 1024)
    for _ in range(64):
        os.write(fd, chunk)
    held.append(fd)
