# attack: a double-forked, setsid child that outlives the test
# expect: refused
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
    os._exit(0)
