"""The workshop kit, built from the committed notebooks: the student and instructor copies, the
slides, the instructor guide, the static site, and `ddp-lab check` (the attendees' pre-flight).

May import: ddp_lab.launching, ddp_lab.instruments (`ddp-lab check` asks deepspeed_ops whether
DeepSpeed's op is built) and the registry (ddp_lab.course.registry).
"""
