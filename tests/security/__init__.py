"""The red team as a suite (issue 34): one test per attack a hostile member can make with only the
API and their own job — links swapped between two steps of a launch, FIFOs, devices, links and huge
files where the plane reads, secrets in the environment or on a command line, fork bombs, leftovers
in /tmp, a team filling the disk. Real Unix accounts (`tests/accounts.py`) and a root plane;
docs/control-plane.md's "Security model" names the test that shows each defence."""
