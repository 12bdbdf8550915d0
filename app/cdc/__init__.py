"""Debezium's meaning of a record: envelopes and unwrap-SMT events unwrapped into change events (unwrap.py), the
connector's source position that orders them (position.py), column types as Debezium sends them (debezium_types.py),
unavailable (TOASTed) values (unavailable.py). Pure DataFrame -> DataFrame steps. May import app/config and
app/errors.
"""
