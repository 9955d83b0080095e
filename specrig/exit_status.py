"""The exit codes of every specrig task, documented in the README."""
import enum


class ExitStatus(enum.IntEnum):
    OK = 0
    #: The check ran and found something: drift, a conflicting patch, a failed run.
    FINDINGS = 1
    #: Bad input: an argument, hosts.yaml, a patchset. Nothing on any host was changed.
    USAGE = 2
    #: The host could not be reached: refused, timed out, name unknown, not SSH.
    CONNECTION = 3
    #: SSH authentication failed.
    AUTH = 4
    #: The host key is unknown (run `inv trust-host`) or changed (possible attack).
    HOST_KEY = 5
    #: The host's Python is missing, not executable or older than 3.9.
    REMOTE_PYTHON = 6
    #: A remote script failed; its traceback is shown.
    REMOTE_ERROR = 7
    #: The remote call exceeded its deadline; the remote process was ended.
    TIMEOUT = 8
    #: Another client holds the lock (applying patches, writing the same output).
    LOCKED = 9
    #: Interrupted by the user (Ctrl-C).
    INTERRUPTED = 130
