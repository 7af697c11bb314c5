# attack: list the repository and the user's Cargo home
# expect: refused
import os
assert os.listdir("{REPO}") or os.listdir("{CARGO_HOME}")
