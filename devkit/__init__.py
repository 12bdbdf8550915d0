"""Tools for the scripts and tests around the job, never shipped with it (setup.cfg packages only app/): the Kafka
Connect client (connect.py), the crash tests' pause points (pauses.py), the tests' class-data sharing archive
(cds.py). May import app/; app/ never imports it."""
