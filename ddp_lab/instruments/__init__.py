"""What the lessons and the doctor measure with, inside a rank: probes (drift between ranks,
collectives on a timeline, memory), the module walker (every tensor a module holds, registered or
not), the rank-aware logger, what torch.compile did on a rank (compilewatch), and DeepSpeed's C++ op
built once outside any rank.

May import: ddp_lab.launching only.
"""
