"""The doctor's examination of a user's module (`ddp_lab.doctor(Model, x)`, run.py): the
arguments validated into one `Subject`, the static checks on one instance, then one phase per
module, each `phase(subject) -> (run, findings)`: ddp.py (the DDP launch), save_load.py (the
checkpoint round trip), sharded.py or tensor_parallel.py, compile_run.py. See the wing's manual,
ddp_lab/doctor/__init__.py."""
