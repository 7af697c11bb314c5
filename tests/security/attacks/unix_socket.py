# attack: open a Unix socket (to reach a host daemon through a bound path)
# expect: refused
import socket
a, b = socket.socketpair()
