"""Execute notebooks in place, in a fresh kernel of this environment, as nbval will run them.

    python tools/execute_notebook.py notebooks/00_launching_ranks.ipynb [...]

Run it after changing a lesson, then commit the executed notebook; `pytest` compares its outputs.
"""
import argparse
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    start = time.time()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return time.time() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK.ipynb")
    args = parser.parse_args(argv)
    for path in args.notebooks:  # all checked before any is executed: nothing half-done
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"{path}: not a notebook file (a path to an existing .ipynb)")
    for path in args.notebooks:  # a cell that raises stops here, its notebook left as it was
        print(f"{path}: executed in {execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main()
