"""What the tests share beside pytest's fixtures: paths, the lab and the CLI (lab.py), and one module per
kind of environment a group of tests builds (patchenv, runnable_env, server_lab, drift_wheels); inventory.py,
the one assertion on a refused hosts.yaml."""
