# attack: recover the real socket class through object.__subclasses__()
# expect: refused
import socket
del socket
sock = next(c for c in object.__subclasses__() if c.__module__ == "_socket" and c.__name__ == "socket")
s = sock(2, 1, 0)
s.connect(("127.0.0.1", {PORT}))
