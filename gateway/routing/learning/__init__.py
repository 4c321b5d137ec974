"""The router learning from its own traffic: what each routed request records for learning (features_record), the
judge of cheap answers (judge), shadow long answers (shadow), all run by one loop per gateway process (loop)."""
