# attack: write a file into a host directory outside the test's own
# expect: refused
# host-check: {HOST_DIR}/escaped must not exist afterwards
with open("{HOST_DIR}/escaped", "w") as f:
    f.write("written from the sandbox")
