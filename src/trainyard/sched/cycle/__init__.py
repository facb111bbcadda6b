"""One cycle of the trainyard policy, split by step: the views and state it keeps (`views.py`,
`state.py`), the order of the pending jobs (`order.py`), the walk of the steps with the order of
the reclaim strategies (`run.py`), reservations (`reserve.py`) and the reasons left (`explain.py`).
"""
