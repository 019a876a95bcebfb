"""What vitlab writes and reads on disk: the output rule (atomic writes, marks, refusals), the run-directory layout
and the cache folder."""
