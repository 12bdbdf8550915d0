"""What the job writes and reads back in the lake: Hudi tables and their options (hudi.py), the offsets and position
each commit records (commit.py), the delete ledger (ledger.py), Bronze ranges (bronze.py), the partition column
(partitioning.py), an interrupted creation repaired (creation.py), the lake's file system (lakefs.py). May import
app/config, app/errors, app/cdc.
"""
