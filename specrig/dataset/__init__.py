"""Is an extraction output trainable, laptop half: `inv verify-dataset`'s data (verify.py) and view (view.py)."""
