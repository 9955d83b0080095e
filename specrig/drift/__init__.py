"""The analyze stage, laptop half: verify-signatures on a host, check-compat on released wheels (remote/drift/ does the work)."""
