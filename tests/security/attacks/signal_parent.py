# attack: kill the parent process and every process in reach
# expect: refused
# host-check: the judging process survives
import os, signal, time
os.kill(os.getppid(), signal.SIGKILL)
os.kill(-1, signal.SIGKILL)
time.sleep(0.2)
os.kill(os.getppid(), 0)
raise AssertionError("the parent survived")
