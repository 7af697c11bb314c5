# attack: fork bomb
# expect: refused
import os
children = 0
while children < 10000:
    if os.fork() == 0:
        while True:
            pass
    children += 1
