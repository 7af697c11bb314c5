# attack: use an inherited host descriptor (a socket, a file or directory of the host)
# expect: refused
import os, stat
reachable = []
for fd in range(3, 1024):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISSOCK(mode) or stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        reachable.append(fd)
assert reachable, "no descriptor leads outside"
