"""The workshop kit, built from the committed notebooks: the student and instructor copies, the
slides, the instructor guide, the static site, and `ddp-lab check` (the attendees' pre-flight).

May import: ddp_lab.launching and the registry (ddp_lab.course.registry) only.
"""
