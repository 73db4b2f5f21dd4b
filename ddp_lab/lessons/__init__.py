"""One module (or package) per lesson, `lNN_<name>`, each defining `LESSON`. See ddp_lab.course.registry
and lessons/README.md.

May import: ddp_lab.course, ddp_lab.instruments, and ddp_lab.launching's public names (never its
engine modules processes, forkserver, child, frames, nor a `_private` name of any module).
"""
