"""Per-key policies, quotas and budgets (issue #23): the keys file (`keys`), who is calling (`caller`),
the counters in one process, across `--workers` or across replicas on Redis (`store`, `shared`, `redis`),
the service that applies them (`service`) and its HTTP edge (`middleware`)."""
