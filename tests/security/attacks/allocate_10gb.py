# attack: allocate 10 GB
# expect: refused
block = bytearray(10 * 1024 ** 3)
block[-1] = 1
