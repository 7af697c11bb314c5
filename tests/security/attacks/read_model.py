# attack: read the model file the server serves
# expect: refused
assert open("{MODEL_FILE}", "rb").read(4) == b"GGUF"
