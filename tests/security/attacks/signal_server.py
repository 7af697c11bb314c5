# attack: signal the server (its host pid) and every process it can see
# expect: refused
import os, signal
os.kill({PID}, signal.SIGTERM)
