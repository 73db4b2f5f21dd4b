"""One module (or package) per lesson, `lNN_<name>`, each defining `LESSON`. See ddp_lab.course.registry."""
