# The one entry point for everything specrig runs on a host:
#     <python> <bundle>/remote/entry.py <args.json>
# This file stays in syntax that any Python parses, so that an interpreter too
# old for the rest of remote/ still reports its version instead of a SyntaxError.
import gc

# Start-up (the imports, the call's reading) makes objects and frees none: the cyclic collector would
# scan them for nothing, a millisecond of a 50 ms verify. rpc.main turns it on for the command.
gc.disable()
import json
import os
import sys

# Everything a call writes on the host is its user's alone (directories 0700, files 0600): run
# records, logs, the call's files; the supervisor and its jobs inherit this. Over SSH the login
# shell set it before it wrote the call file; `--host local` and scripts calling entry.py get it here.
os.umask(0o077)

MINIMUM = (3, 9)

if sys.version_info[:2] < MINIMUM:
    from base.contract import SENTINEL  # plain syntax: any Python imports it

    sys.stdout.write("\n" + SENTINEL + " " + json.dumps({
        "ok": False,
        "error": {
            "kind": "python-too-old",
            "message": "Python %d.%d.%d at %s is older than the %d.%d specrig needs"
            % (sys.version_info[0], sys.version_info[1], sys.version_info[2],
               sys.executable, MINIMUM[0], MINIMUM[1]),
        },
    }) + "\n")
    sys.exit(3)

import rpc  # only after the version check

if __name__ == "__main__":
    rpc.main(sys.argv[1:])
