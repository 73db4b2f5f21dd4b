"""Execute notebooks in place, in a fresh kernel of this environment, as nbval will run them.

    python tools/execute_notebook.py notebooks/00_launching_ranks.ipynb [...]

Run it after changing a lesson, then commit the executed notebook; `pytest` compares its outputs.
"""
import sys
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


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: executed in {execute(Path(arg)):.1f} s")
