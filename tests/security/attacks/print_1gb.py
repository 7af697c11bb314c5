# attack: print 1 GB to stdout and stderr
# expect: bounded
import sys
chunk = "x" * (1 << 20)
for _ in range(1024):
    sys.stdout.write(chunk)
    sys.stderr.write(chunk)
