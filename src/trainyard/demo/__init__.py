"""`make demo`: a small mixed workload on an emulated 2-node cluster, shown live (`yard demo`)."""
