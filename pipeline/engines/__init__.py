"""Who encodes a precompute's shards: this process (local) or a pool of Ray actors, and Ray's probe and reaper."""
