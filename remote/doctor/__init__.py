"""What is on the host, host half: the `doctor` command (report.py). It reads every stage's facts (the run's
model checks and storage, Slurm's cluster), so it stands above them all, under the entry."""
