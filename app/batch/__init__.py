"""One micro-batch: the plan model (plan.py), the planner that builds it (planner.py), several topics merged into
one table (merge.py), the exactly-once unit per table (writer.py), and the foreachBatch processor (processor.py).
May import every package below it; nothing in app/ but app/job.py imports it.
"""
