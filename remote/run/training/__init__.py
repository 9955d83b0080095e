"""A training run: speculators' trainer on a verified dataset, supervised as an extraction is (issue 36)."""
