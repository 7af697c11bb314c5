# attack: drop the socket modules and import a fresh _socket
# expect: refused
import sys
for name in ("socket", "_socket"):
    sys.modules.pop(name, None)
import _socket
s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
s.connect(("127.0.0.1", {PORT}))
