# attack: fill /tmp with 400,000 empty files (their inodes are kernel memory, not file bytes)
# expect: refused
import os
for i in range(400_000):
    os.close(os.open("/tmp/f%d" % i, os.O_CREAT | os.O_WRONLY, 0o600))
