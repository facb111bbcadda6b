"""`trainyard.ports.free_port`: a free port below the ephemeral range, usable at once."""

from __future__ import annotations

import random
import socket

from trainyard.ports import LOWEST, ephemeral_range, free_port


def test_the_port_is_free_and_outside_the_range_outgoing_connections_draw_from() -> None:
    lo, hi = ephemeral_range()
    assert 1024 <= lo <= hi <= 65535
    for _ in range(20):
        port = free_port()
        if lo - 1 > LOWEST:
            assert LOWEST <= port < lo
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing holds it
            s.listen()


def test_a_port_in_use_is_not_chosen() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # a generator that proposes the taken port first: free_port must skip it
        class FirstTaken(random.Random):
            calls = 0

            def randint(self, a: int, b: int) -> int:
                self.calls += 1
                return taken if self.calls == 1 else super().randint(a, b)

        rng = FirstTaken(0)
        port = free_port(rng=rng)
        assert port != taken


def test_an_address_not_of_this_host_gives_a_port_free_on_all_addresses() -> None:
    port = free_port("node-that-does-not-exist")
    with socket.socket() as s:
        s.bind(("", port))


def test_a_port_another_picker_just_took_is_not_handed_out_again(tmp_path, monkeypatch) -> None:
    """Two pickers drawing the same free port: the second skips it while the first one's lease is
    fresh (the first rank 0 may not have bound it yet), and takes it once the lease is stale."""
    import os
    import time

    import trainyard.ports as P

    monkeypatch.setattr(P.tempfile, "gettempdir", lambda: str(tmp_path))

    class Same(random.Random):
        def __init__(self, first: int) -> None:
            super().__init__(0)
            self.first, self.calls = first, 0

        def randint(self, a: int, b: int) -> int:
            self.calls += 1
            return self.first if self.calls == 1 else super().randint(a, b)

    port = free_port()
    assert free_port(rng=Same(port)) != port  # leased by the first pick, though still bindable
    lease = P.lease_dir() / str(port)
    assert lease.is_file() and oct(P.lease_dir().stat().st_mode & 0o777) == "0o700"
    old = time.time() - P.LEASE_S - 1
    os.utime(lease, (old, old))
    assert free_port(rng=Same(port)) == port  # a stale lease is taken over
