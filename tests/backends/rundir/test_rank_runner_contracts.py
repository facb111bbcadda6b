"""The rank runner runs by path with `-I -S` and loads nothing of trainyard, so it names the exit codes
of the contract itself: they must be the contract's (`contracts.NOT_FOUND_EXIT`, `CANNOT_EXECUTE_EXIT`)."""

from trainyard import contracts
from trainyard.backends.rundir import rank_runner


def test_the_rank_runner_exits_with_the_contracts_codes():
    assert rank_runner.NOT_FOUND_EXIT == contracts.NOT_FOUND_EXIT
    assert rank_runner.CANNOT_EXECUTE_EXIT == contracts.CANNOT_EXECUTE_EXIT
    assert contracts.NOTICE_SIGNAL in rank_runner.SURVIVE  # the runner outlives the notice it passes on
