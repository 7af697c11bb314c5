# attack: read the file the server's API key came from
# expect: refused
secret = open("{KEY_FILE}").read()
assert secret
