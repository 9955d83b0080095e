"""Run specrig's command line in this process and print, as its last stdout line, the JSON list of
the modules it loaded: `modules_loaded.py inv --list`, `modules_loaded.py specrig --list`.

`inv` is Invoke's own program over a checkout's tasks.py; `specrig` the installed command's
(specrig.cli.program). tests/test_lazy_imports.py reads the list."""
import json
import sys


def main():
    name, *argv = sys.argv[1:]
    if name == "inv":
        from invoke.main import program
    else:
        from specrig.cli.program import program
    try:
        program.run([name, *argv], exit=False)
    except SystemExit:
        pass
    sys.stdout.write("\n" + json.dumps(sorted(sys.modules)) + "\n")


if __name__ == "__main__":
    main()
