"""The engine and the record of a run: `launch` starts real ranks (one fresh process each, forked
from a clean fork server or spawned), watches them, stops a hung one with every thread's stack,
and brings back a `RunResult`; the flight recorder, py-spy, torchrun's own ranks, where the ranks
stop agreeing, sanitizing and displaying results live here too.

May import: nothing else of ddp_lab (every other part stands on this one).
"""
