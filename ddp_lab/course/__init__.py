"""The course machinery: the lesson registry (every scenario declared once), the tour, the
exercise checker, the try-it-yourself panel, the `%%ddp` magic, the shared plots.

May import: ddp_lab.launching and ddp_lab.instruments; the lessons only through the registry's
discovery (`lessons()`), never by name.
"""
