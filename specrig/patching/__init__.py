"""The patch stage, laptop half: apply, status and revert through the host's engine (remote/patching/)."""
