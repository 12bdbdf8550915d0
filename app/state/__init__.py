"""What the job knows about itself across batches and runs: where to resume (resume.py), the status document
(status.py) and a batch's figures per table (stats.py). May import everything below app/batch.
"""
