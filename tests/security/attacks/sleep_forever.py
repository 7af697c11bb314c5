# attack: sleep forever
# expect: refused
import time
time.sleep(10 ** 9)
