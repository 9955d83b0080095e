"""`RemoteFailure`: an expected failure of a host command, reported to the laptop by its kind.

Every stage raises it and remote/rpc.py turns it into the call's error; it lies in the ground so that no
stage imports the entry (specrig/transport/failures.py maps each kind to the laptop's error).
"""


class RemoteFailure(Exception):
    """An expected failure of a remote command, reported by kind rather than traceback."""

    def __init__(self, kind, message, **details):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.details = details

    def as_error(self):
        return dict(self.details, kind=self.kind, message=self.message)
