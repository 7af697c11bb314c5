# attack: delete a host file outside the test's directory
# expect: refused
# host-check: {VICTIM} must still exist afterwards
import os
os.remove("{VICTIM}")
