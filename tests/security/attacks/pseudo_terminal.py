# attack: allocate pseudo-terminals
# expect: refused
import os
pairs = [os.openpty() for _ in range(8)]
