"""Training a draft on extracted states, and proving it: `inv train`, `inv accept` (issue 36)."""
