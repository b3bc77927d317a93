"""`python -m dsh`: the `dsh` command (handy with `python -X importtime -m dsh ...`).

Layer: CLI (an entry point; `dsh.cli.main.main` does the work).
"""

from dsh.cli.main import main

if __name__ == "__main__":
    main()
