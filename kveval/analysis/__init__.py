"""Pure analysis over stored results: functions of (manifest, workloads, cells) dicts, no engine."""
