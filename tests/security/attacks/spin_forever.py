# attack: burn CPU forever
# expect: refused
while True:
    pass
