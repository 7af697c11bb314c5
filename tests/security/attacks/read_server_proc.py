# attack: read the server's command line and environment through /proc
# expect: refused
cmdline = open("/proc/{PID}/cmdline", "rb").read()
environ = open("/proc/{PID}/environ", "rb").read()
assert cmdline or environ
