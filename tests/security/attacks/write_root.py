# attack: write next to the system files (/, /usr/lib, /dev)
# expect: refused
import os
for path in ("/escaped", "/usr/lib/escaped", "/dev/escaped"):
    try:
        open(path, "w").close()
        break
    except OSError:
        pass
else:
    raise AssertionError("every write was refused")
