"""`python -m ddp_lab.doctor path/to/file.py:Name --input "torch.randn(8, 16)"`."""
import sys

from .cli import main

sys.exit(main())
