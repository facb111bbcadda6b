"""The rules the reconcile step applies to an ended attempt, kept apart from the loop so each has
tests of its own: how it ended (`outcome`), whether to retry (`retry`), what the plane itself did
to it (`blame`), how much work it threw away (`lost_work`)
and where its GPU-seconds went (`ledger`)."""
