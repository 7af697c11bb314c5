# attack: read a host file outside the test's directory (/etc/hostname)
# expect: refused
assert open("/etc/hostname").read()
