# attack: reach another address (TCP and UDP)
# expect: refused
import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"x", ("10.0.0.1", 53))
socket.create_connection(("10.0.0.1", 80), timeout=1)
