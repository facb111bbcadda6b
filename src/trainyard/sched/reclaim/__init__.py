"""Step 5's reclaim strategies, one module each, behind `base.Strategy`.

The order in which a cycle tries them is written once, in `sched/cycle/run.py` (`STEPS_QUOTA`,
`STEPS_CAPACITY`, `STEPS_FRAGMENTED`); the victim search they share is `victims.py`.
"""
