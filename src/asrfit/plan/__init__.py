"""Plan: search the setups, choose buckets and accumulation, save and export the plan."""
