# attack: spawn another interpreter (the one binary the sandbox shows)
# expect: refused
import os, sys
pid = os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], {})
os.waitpid(pid, 0)
