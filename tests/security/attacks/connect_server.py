# attack: open a TCP connection to the server itself on 127.0.0.1
# expect: refused
# host-check: the listener on 127.0.0.1:{PORT} must see no connection
import socket
s = socket.create_connection(("127.0.0.1", {PORT}), timeout=1)
s.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
