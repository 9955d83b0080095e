"""From a dataset to a draft: speculators' training run on a host, and the draft's acceptance measured."""
