# attack: spawn a shell
# expect: refused
import subprocess
subprocess.run(["/bin/sh", "-c", "true"], check=True)
