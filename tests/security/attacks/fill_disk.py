# attack: fill the disk with a large file
# expect: refused
with open("big", "wb") as f:
    for _ in range(1024):
        f.write(b"\0" * (1 << 20))
