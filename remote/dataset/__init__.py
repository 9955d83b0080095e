"""Is an extraction output trainable, host half: the `dataset.verify` command (verify.py), the training
command and the trainer's refusals (command.py), the trainer's own loading code (trainer_load.py, a program)."""
