"""Which Silver table a topic feeds: the naming rule, partitions and shards (route.py), the source's partitioned
tables read from its catalog (catalog.py). May import app/config and app/errors.
"""
