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
